"""The `tandem` command parses its arguments without loading torch or transformers (a slow import, and the
control-plane services never need it); a command that needs them imports them when it runs."""

import subprocess
import sys


def test_the_tandem_command_starts_without_torch():
    code = (
        "import sys, tandem.cli; tandem.cli.build_parser(); "
        "print(sorted(m for m in ('torch', 'transformers', 'triton') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
