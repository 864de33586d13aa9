"""``python -m serving.deploy NAME``: serve a recorded deployment (what `flatpack deploy --detach` starts)."""

from __future__ import annotations

import logging
import sys

from functions.settings import log_level
from serving.deploy.local import serve
from serving.deploy.state import DeploymentRecord


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m serving.deploy NAME")
    logging.basicConfig(level=log_level(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    record = DeploymentRecord.load(sys.argv[1])
    keep_warm = float(record.options.get("keep_warm_s", 0) or 0)
    serve(record, keep_warm_s=keep_warm)


if __name__ == "__main__":
    main()
