"""``python -m serving.platform``: the local platform in the foreground (``flatpack platform start`` runs this)."""

from __future__ import annotations

import argparse
import logging

from functions.settings import log_level
from serving.platform.config import PlatformConfig
from serving.platform.server import serve


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m serving.platform", description=__doc__)
    ap.add_argument("--host", default=None)
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--idle-timeout-s", type=float, default=None)
    ap.add_argument("--cpu-limit", default=None, help="auto, cgroup, cgroup-v2, cgroup-v1, dilation or off")
    args = ap.parse_args()
    logging.basicConfig(level=log_level(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(PlatformConfig.from_env(host=args.host, port=args.port, profile=args.profile,
                                  idle_timeout_s=args.idle_timeout_s, cpu_limit=args.cpu_limit))


if __name__ == "__main__":
    main()
