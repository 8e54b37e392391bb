"""README's promises that CPU CI can check: its test command is the one .ci/run executes."""

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_ci_runs_the_readme_test_command():
    ci_command = re.search(r"^TEST_COMMAND='(.+)'$", (ROOT / ".ci/run").read_text(), re.M).group(1)
    readme = (ROOT / "README.md").read_text()
    test_section = readme.split("## Test", 1)[1]
    assert f"```bash\n{ci_command}\n```" in test_section
