"""Issue 27 item 5: a read-only home works. The kernels built at install (beside the source) are
found when the home cannot be written, and with no build anywhere and nowhere to build, the app
runs the fp32 path with its one-line note instead of `Permission denied`."""

import os
import subprocess
import sys

import pytest
from helpers import as_other_user

from model.cpu import native

PROBE = ("from model.cpu import native; lib = native.library(); "
         "print('built' if lib else 'none: ' + native.why_not())")


@pytest.fixture
def readonly_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o555)
    tmp_path.chmod(0o755)
    yield home
    home.chmod(0o755)


def probe(home, prefix, extra_env=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "NANOCHAT_TUI_HOME": str(home), "HOME": str(home), **(extra_env or {})}
    return subprocess.run([*prefix, sys.executable, "-c", PROBE], capture_output=True, text=True, env=env,
                          timeout=120, cwd=os.getcwd())


def test_the_install_build_is_found_from_a_read_only_home(readonly_home):
    if native.library() is None:
        pytest.skip(f"no CPU kernels on this machine: {native.why_not()}")
    r = probe(readonly_home, as_other_user())
    assert r.returncode == 0 and r.stdout.strip() == "built", r.stderr[-2000:]


def test_nowhere_to_build_is_the_fp32_note_not_a_traceback(readonly_home, tmp_path):
    """A compiler whose flags match no build (CC names another path): nothing to find, and the
    source folder is not ours to write as the other user either."""
    prefix = as_other_user()
    if not prefix:
        pytest.skip("needs to run as another user (root with setpriv) so the source folder is read-only")
    cc = tmp_path / "cc"
    cc.symlink_to(native.compiler() or "/bin/false")
    r = probe(readonly_home, prefix, {"CC": str(cc)})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stdout.startswith("none: no build of them is readable here"), r.stdout
