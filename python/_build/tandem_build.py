"""A PEP 517 build backend in the standard library only, so that `pip install ./python` works
on a machine with no network and no `wheel` package (Debian's setuptools 65 cannot build a
wheel without it, and pip's build isolation would download both). The package is pure Python:
a wheel is a zip of tandem/ plus the dist-info files PEP 427 asks for.

Hooks: build_wheel, build_sdist, build_editable (PEP 660: a .pth file naming this directory),
get_requires_for_* (nothing) and prepare_metadata_for_build_*.
"""
import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "tandem"


def _version():
    with open(os.path.join(ROOT, "tandem", "_run.py")) as f:
        return re.search(r'^SDK_VERSION = "([^"]+)"', f.read(), re.M).group(1)


def _metadata():
    summary = ("Log metrics, config, checkpoints and artifacts of a PyTorch script to a "
               "tandem run")
    readme = open(os.path.join(ROOT, "README.md")).read()
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {_version()}\nSummary: {summary}\n"
            f"Requires-Python: >=3.8\nProvides-Extra: torch\n"
            f"Requires-Dist: torch; extra == \"torch\"\n"
            f"Description-Content-Type: text/markdown\n\n{readme}")


def _dist_info():
    return f"{NAME}-{_version()}.dist-info"


def _wheel_name():
    return f"{NAME}-{_version()}-py3-none-any.whl"


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory, files):
    di = _dist_info()
    files = list(files) + [
        (f"{di}/METADATA", _metadata().encode()),
        (f"{di}/WHEEL", b"Wheel-Version: 1.0\nGenerator: tandem_build\nRoot-Is-Purelib: true\n"
                        b"Tag: py3-none-any\n"),
        (f"{di}/top_level.txt", f"{NAME}\n".encode()),
    ]
    record = [_record_line(p, d) for p, d in files] + [f"{di}/RECORD,,"]
    files.append((f"{di}/RECORD", ("\n".join(record) + "\n").encode()))
    path = os.path.join(wheel_directory, _wheel_name())
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files:
            info = zipfile.ZipInfo(p, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, d)
    return os.path.basename(path)


def _package_files():
    out = []
    pkg = os.path.join(ROOT, NAME)
    for dirpath, dirs, names in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for n in sorted(names):
            if n.endswith(".py"):
                full = os.path.join(dirpath, n)
                with open(full, "rb") as f:
                    out.append((os.path.relpath(full, ROOT).replace(os.sep, "/"), f.read()))
    return out


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    di = os.path.join(metadata_directory, _dist_info())
    os.makedirs(di, exist_ok=True)
    with open(os.path.join(di, "METADATA"), "w") as f:
        f.write(_metadata())
    return _dist_info()


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(f"__editable__.{NAME}.pth", f"{ROOT}\n".encode())])


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{_version()}"
    path = os.path.join(sdist_directory, f"{base}.tar.gz")
    with tarfile.open(path, "w:gz") as t:
        for rel in ["pyproject.toml", "README.md", "_build/tandem_build.py"] + [
                p for p, _ in _package_files()]:
            t.add(os.path.join(ROOT, rel), arcname=f"{base}/{rel}")
        pkg_info = _metadata().encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        t.addfile(info, io.BytesIO(pkg_info))
    return os.path.basename(path)
