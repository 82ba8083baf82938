"""The mTLS listener's context: loading its files with messages naming the flag, changes seen."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gatekeeper.errors import ConfigError
from gatekeeper.listen.tls import ServerTLS, TLSFiles, file_identity
from gatekeeper.testing.harness import PKI


def files(pki: PKI, **overrides: str) -> TLSFiles:
    paths = {
        "cert_file": pki.path("server.crt"),
        "key_file": pki.path("server.key"),
        "client_ca_file": pki.path("ca.crt"),
    }
    paths.update(overrides)
    return TLSFiles(**paths)


@pytest.mark.parametrize(
    ("which", "flag"),
    [
        ("cert_file", "--tls-cert-file"),
        ("key_file", "--tls-key-file"),
        ("client_ca_file", "--client-ca-file"),
    ],
)
def test_unloadable_file_names_the_flag_and_file(
    pki: PKI, tmp_path: Path, which: str, flag: str
) -> None:
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(ConfigError) as caught:
        ServerTLS.load(files(pki, **{which: missing}))
    assert flag in str(caught.value) and missing in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_missing_file_is_named_alone(pki: PKI, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.crt")
    with pytest.raises(ConfigError) as caught:
        ServerTLS.load(files(pki, cert_file=missing))
    assert str(caught.value) == f"--tls-cert-file {missing}: cannot read: No such file or directory"


@pytest.mark.parametrize(
    ("cert", "key", "message"),
    [
        (
            "server.key",
            "server.crt",
            "certificate and key do not match (the two files are swapped)",
        ),
        ("server.crt", "client", "certificate and key do not match"),
        ("ca.crt", "server.key", "certificate and key do not match"),
    ],
    ids=["swapped", "another-key", "another-certificate"],
)
def test_a_pair_that_does_not_match_says_so(pki: PKI, cert: str, key: str, message: str) -> None:
    key_file = pki.client_files("gpu.example.com")[1] if key == "client" else pki.path(key)
    cert_file = pki.path(cert)
    with pytest.raises(ConfigError) as caught:
        ServerTLS.load(files(pki, cert_file=cert_file, key_file=key_file))
    assert (
        str(caught.value) == f"--tls-cert-file {cert_file} / --tls-key-file {key_file}: {message}"
    )


def test_changes_are_seen_through_symlinks(pki: PKI, tmp_path: Path) -> None:
    first = tmp_path / "a.crt"
    first.write_bytes(Path(pki.path("ca.crt")).read_bytes())
    link = tmp_path / "ca.crt"
    os.symlink(first.name, link)
    tls = ServerTLS.load(files(pki, client_ca_file=str(link)))
    assert not tls.changed()
    second = tmp_path / "b.crt"
    second.write_bytes(first.read_bytes())
    os.symlink(second.name, tmp_path / "tmp-link")
    os.replace(tmp_path / "tmp-link", link)
    assert tls.changed() and file_identity(str(link)) == file_identity(str(second))
    tls.reload()
    assert not tls.changed()
    assert file_identity(str(tmp_path / "none")) is None
