"""The MXNet side of `flatpack bench backends`: ``python -m bench.components.backends_mxnet`` in the MXNet env.

Reads a JSON request on stdin ``{"parts": [{"file", "inputs": {name: key}}], "inputs": NPZ, "out": NPZ,
"reps", "warmup", "threads"}``, binds each part (:func:`functions.backends.mxnet.load_part`), runs it
``warmup`` times untimed and ``reps`` times timed with ``perf_counter``, writes the last outputs to
``out`` (key ``p<i>.o<j>``) and prints ``{"parts": [{"load_ms", "times_ms"}], "versions"}`` as JSON.
Needs only numpy, onnx and MXNet (this module runs under numpy 1.23).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    req = json.load(sys.stdin)
    threads = int(req.get("threads", 1))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import mxnet
    import numpy as np

    from functions.backends.mxnet import load_part

    data = np.load(req["inputs"])
    outs: dict[str, np.ndarray] = {}
    rows = []
    for i, spec in enumerate(req["parts"]):
        t0 = time.perf_counter()
        part = load_part(spec["file"], threads=threads)
        load_ms = 1e3 * (time.perf_counter() - t0)
        x = {name: data[key] for name, key in spec["inputs"].items()}
        for _ in range(int(req.get("warmup", 2))):
            part.run(x)
        times = []
        y: dict[str, np.ndarray] = {}
        for _ in range(int(req.get("reps", 20))):
            t0 = time.perf_counter()
            y = part.run(x)
            times.append(1e3 * (time.perf_counter() - t0))
        for j, name in enumerate(part.output_names):
            outs[f"p{i}.o{j}"] = y[name]
        rows.append({"file": spec["file"], "load_ms": load_ms, "times_ms": times, "outputs": part.output_names})
    np.savez(req["out"], **outs)  # type: ignore[arg-type]  # numpy's stub: a ** dict might fill allow_pickle
    json.dump({"parts": rows, "versions": {"mxnet": mxnet.__version__, "numpy": np.__version__}}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
