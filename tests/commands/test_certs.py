"""`fedforest certs init/issue` run in-process: files, key modes, roles, hosts and refusing to overwrite."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

from cryptography import x509

from fedcore.cli import main
from fedcore.transport.tls import certificate_identity


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _sans(path: Path) -> list[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(n.value) for n in names]


def test_init_and_issue(tmp_path: Path, capsys) -> None:
    d = tmp_path / "certs"
    assert _run(capsys, "certs", "init", "--dir", d)[0] == 0
    assert stat.S_IMODE((d / "ca.key").stat().st_mode) == 0o600
    code, out, _ = _run(capsys, "certs", "issue", "master", "--dir", d)
    assert code == 0 and "master 'master'" in out
    code, _, _ = _run(capsys, "certs", "issue", "bank", "--dir", d, "--host", "bank.example.org",
                      "--host", "10.0.0.5", "--out", tmp_path / "bank")
    assert code == 0
    assert certificate_identity((d / "master.pem").read_bytes()) == ("master", "master")
    bank = tmp_path / "bank" / "bank.pem"
    assert certificate_identity(bank.read_bytes()) == ("bank", "institution")
    assert _sans(bank) == ["urn:fedforest:institution:bank", "bank.institution.fedforest", "bank.example.org",
                           str(ipaddress.ip_address("10.0.0.5"))]
    assert stat.S_IMODE((tmp_path / "bank" / "bank.key").stat().st_mode) == 0o600
    ca = x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
    x509.load_pem_x509_certificate(bank.read_bytes()).verify_directly_issued_by(ca)


def test_existing_files_are_kept_unless_forced(tmp_path: Path, capsys) -> None:
    d = tmp_path / "certs"
    _run(capsys, "certs", "init", "--dir", d)
    _run(capsys, "certs", "issue", "bank", "--dir", d)
    before = (d / "bank.key").read_bytes()
    code, _, err = _run(capsys, "certs", "issue", "bank", "--dir", d)
    assert code == 1 and "refusing to overwrite" in err and "--force" in err
    assert (d / "bank.key").read_bytes() == before
    assert _run(capsys, "certs", "issue", "bank", "--dir", d, "--force")[0] == 0
    assert (d / "bank.key").read_bytes() != before
    assert stat.S_IMODE((d / "bank.key").stat().st_mode) == 0o600
    code, _, err = _run(capsys, "certs", "init", "--dir", d)
    assert code == 1 and "ca.pem" in err


def test_clear_errors(tmp_path: Path, capsys) -> None:
    code, _, err = _run(capsys, "certs", "issue", "bank", "--dir", tmp_path / "nothing")
    assert code == 1 and "cannot read the CA certificate" in err
    _run(capsys, "certs", "init", "--dir", tmp_path)
    code, _, err = _run(capsys, "certs", "issue", "bad name", "--dir", tmp_path)
    assert code == 1 and "certificate name 'bad name'" in err
    code, _, err = _run(capsys, "certs", "issue", "bank", "--dir", tmp_path, "--role", "admin")
    assert code == 1 and "invalid choice" in err
