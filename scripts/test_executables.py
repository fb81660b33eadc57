"""Print the test executables that `cargo test --no-run --message-format=json` built, one per line.

    cargo test -p npumem-core --release --no-run --message-format=json \\
        | python scripts/test_executables.py

Reads cargo's JSON messages on standard input; exits 1 with one line on standard error if a
line is not a JSON object or no test executable was built.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    found = []
    for number, line in enumerate(sys.stdin, start=1):
        line = line.strip()
        if not line:
            continue
        try:
            message = json.loads(line)
        except json.JSONDecodeError as exc:
            print(f"test_executables: line {number} is not JSON: {exc}", file=sys.stderr)
            return 1
        if not isinstance(message, dict):
            print(f"test_executables: line {number} is not a JSON object", file=sys.stderr)
            return 1
        profile = message.get("profile")
        executable = message.get("executable")
        built = message.get("reason") == "compiler-artifact" and executable
        if built and isinstance(profile, dict) and profile.get("test"):
            found.append(str(executable))
    if not found:
        print("test_executables: cargo built no test executable", file=sys.stderr)
        return 1
    print("\n".join(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
