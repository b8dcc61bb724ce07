"""Kiln's PEP 517 build backend: builds the kiln package's wheel with the standard library alone, so that
`pip install ./python` works offline (nothing to fetch for the build) and with Debian's pip.

The wheel holds the package (python/kiln) and kiln/_source.py, which records the Kiln source tree the
wheel was built from: an installed kiln that finds no binary ($KILN, kiln on PATH) builds one there
with `go build`."""
import base64
import hashlib
import os
import tarfile
import zipfile

NAME, VERSION = "kiln", "0.1.0"
_HERE = os.path.dirname(os.path.abspath(__file__))
_PROJECT = os.path.dirname(_HERE)  # python/
_ROOT = os.path.dirname(_PROJECT)  # the source tree
_TAG = "py3-none-any"


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
            "Summary: Kiln: memory-optimising training steps for PyTorch modules, compiled and run in process\n"
            "Requires-Python: >=3.9\n"
            "Description-Content-Type: text/plain\n\n"
            "Needs torch, numpy and onnx (Debian's python3-torch, python3-numpy, python3-onnx), which it does not\n"
            "install, and a kiln binary ($KILN, kiln on PATH, or Go to build one from the source tree).\n")


def _files():
    """(path in the wheel, bytes) of the package."""
    pkg = os.path.join(_PROJECT, NAME)
    out = []
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py") and name != "_source.py":
            with open(os.path.join(pkg, name), "rb") as f:
                out.append((f"{NAME}/{name}", f.read()))
    root = _ROOT if os.path.isfile(os.path.join(_ROOT, "go.mod")) else None
    out.append((f"{NAME}/_source.py", f'"""Where this installed package was built from."""\nROOT = {root!r}\n'.encode()))
    return out


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _dist_info(metadata_directory=None):
    info = f"{NAME}-{VERSION}.dist-info"
    files = [(f"{info}/METADATA", _metadata().encode()),
             (f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: kiln_build\nRoot-Is-Purelib: true\nTag: {_TAG}\n".encode())]
    return info, files


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info, files = _dist_info()
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    for path, data in files:
        with open(os.path.join(metadata_directory, path), "wb") as f:
            f.write(data)
    return info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    info, meta = _dist_info()
    name = f"{NAME}-{VERSION}-{_TAG}.whl"
    entries = _files() + meta
    record = [_record_line(p, d) for p, d in entries] + [f"{info}/RECORD,,"]
    final = os.path.join(wheel_directory, name)
    tmp = final + ".part"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in entries:
            z.writestr(zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0)), data)
        z.writestr(zipfile.ZipInfo(f"{info}/RECORD", date_time=(1980, 1, 1, 0, 0, 0)), "\n".join(record) + "\n")
    os.replace(tmp, final)
    return name


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{VERSION}"
    name = f"{base}.tar.gz"
    final = os.path.join(sdist_directory, name)
    tmp = final + ".part"
    with tarfile.open(tmp, "w:gz") as t:
        for rel in ["pyproject.toml", "build_backend/kiln_build.py"] + [f"{NAME}/{n}" for n in sorted(os.listdir(os.path.join(_PROJECT, NAME))) if n.endswith(".py") and n != "_source.py"]:
            t.add(os.path.join(_PROJECT, rel), arcname=f"{base}/{rel}")
        data = _metadata().encode()
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(data)
        import io
        t.addfile(ti, io.BytesIO(data))
    os.replace(tmp, final)
    return name
