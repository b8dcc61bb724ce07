"""The package as a new user gets it: `pip install ./python` into a fresh virtual environment (made with
--system-site-packages, so that Debian's torch is seen; offline: the build backend is in-tree), then
the README's Python example (at most 10 lines: Fashion-MNIST with F.cross_entropy, an epoch, test
accuracy from the eval step, a checkpoint saved and reopened) run from another folder, with no
PYTHONPATH and no $KILN: the installed package builds its kiln binary from the source tree it was
installed from (recorded at installation) with go build.
Run: /usr/bin/python3 python/tests/test_package.py (needs Go on PATH or in /usr/local/go/bin)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_example():
    """The first python block of the README's section "From Python"."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text[text.index("## From Python"):]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "the README's Python section has no python block"
    return m.group(1)


def main():
    example = readme_example()
    lines = [line for line in example.splitlines() if line.strip()]
    assert len(lines) <= 10, f"the README's example has {len(lines)} lines"
    go = shutil.which("go") or "/usr/local/go/bin/go"
    assert os.path.exists(go), "Go is needed to build the kiln binary"
    with tempfile.TemporaryDirectory(prefix="kiln-package-") as tmp:
        venv = os.path.join(tmp, "venv")
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], check=True)
        python = os.path.join(venv, "bin", "python")
        pip = subprocess.run([python, "-m", "pip", "install", "--no-cache-dir", "--no-index", os.path.join(ROOT, "python")],
                             capture_output=True, text=True)
        assert pip.returncode == 0, pip.stdout + pip.stderr
        elsewhere = os.path.join(tmp, "elsewhere")
        os.mkdir(elsewhere)
        with open(os.path.join(elsewhere, "example.py"), "w") as f:
            f.write(example)
        env = {k: v for k, v in os.environ.items() if k not in ("KILN", "PYTHONPATH")}
        # No kiln on PATH: the package must build one (Go stays reachable).
        env["PATH"] = os.pathsep.join([os.path.dirname(go)] + [p for p in env.get("PATH", "").split(os.pathsep)
                                                                if p and not os.path.exists(os.path.join(p, "kiln"))])
        # A fresh cache for kiln's binary; Go's own build cache stays (XDG_CACHE_HOME would move it too).
        env["GOCACHE"] = subprocess.run([go, "env", "GOCACHE"], capture_output=True, text=True, check=True).stdout.strip()
        env["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")
        where = subprocess.run([python, "-c", "import kiln; print(kiln.__file__)"], cwd=elsewhere, env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
        assert where.startswith(venv), f"kiln came from {where}, not the virtual environment"
        run = subprocess.run([python, "example.py"], cwd=elsewhere, env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "building the kiln binary" in run.stderr, run.stderr
        m = re.search(r"test accuracy ([0-9.]+)", run.stdout)
        assert m and float(m.group(1)) > 0.8, run.stdout  # one epoch of this CNN: about 0.88
        assert os.path.isfile(os.path.join(elsewhere, "fmnist.kiln", "step.so")), "the checkpoint was not saved"
        print(f"pip install ./python into a fresh venv, then the README's {len(lines)} lines from another folder: "
              f"test accuracy {float(m.group(1)):.3f}")
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
