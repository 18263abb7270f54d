"""`vramguard-probe live|ready [--file PATH]`: the kubelet's exec probe, answered from the agent's health file.

Exit 0 when the check passes, 1 when it does not, 2 on a usage error; one line on standard output says why (the
kubelet shows it in the pod's Events). Nothing but the health file is read: no network, port or client is involved
(`base/healthfile.py`). The arguments are parsed by hand: this runs every probe period, and argparse would be a third
of its start-up.
"""

from __future__ import annotations

import sys
import time

from vramguard.base import healthfile

USAGE = f"usage: vramguard-probe {{{'|'.join(healthfile.PROBES)}}} [--file PATH]   (default {healthfile.DEFAULT_PATH})"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    path = healthfile.DEFAULT_PATH
    if len(args) == 3 and args[1] == "--file" and args[2]:
        path = args.pop()
        args.pop()
    elif len(args) == 2 and args[1].startswith("--file=") and len(args[1]) > len("--file="):
        path = args.pop()[len("--file=") :]
    if len(args) != 1 or args[0] not in healthfile.PROBES:
        print(USAGE, file=sys.stderr)
        return 2
    probe = args[0]
    try:
        document = healthfile.decode(healthfile.read(path))
    except healthfile.HealthFileError as e:
        print(f"{probe}: {e}")
        return 1
    ok, why = healthfile.verdict(document, probe, time.monotonic())
    print(f"{probe}: {why}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
