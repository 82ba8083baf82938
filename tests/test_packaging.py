"""The distribution: the wheel carries the Apache-2.0 LICENSE that pyproject names, the packaged
default policy, the file formats' schemas and the type marker; built offline from a copy of the
sources."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_repository_has_the_apache_license() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX" in text


def test_the_wheel_carries_the_license(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copyfile(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "gatekeeper", source / "gatekeeper", ignore=shutil.ignore_patterns("__pycache__")
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), str(source)],
        check=True,
        timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("dra_gatekeeper-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (license_name,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(license_name) == (ROOT / "LICENSE").read_bytes()
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(metadata_name).decode())
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License-File"] == "LICENSE"
    assert "gatekeeper/policies/default.yaml" in names and "gatekeeper/py.typed" in names
    # The schemas the loaders validate with at run time (the image installs from gatekeeper/).
    assert "gatekeeper/policyfile/policy.schema.json" in names
    assert "gatekeeper/policyfile/policytest.schema.json" in names
