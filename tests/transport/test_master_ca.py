"""A master CA (issue #27, point 3): agents that trust only it refuse every other member at the TLS handshake.

A member's certificate (from the consortium CA) used to pass the handshake, so gRPC read a `do_action` body
of any size before the agent's peer check could refuse it. With `tls.master_ca` the handshake itself fails:
nothing the member sends is read, and the agent's Python code never runs. The master, with a certificate the
master CA signed, is served as before; what it can still make an agent read is stated in
`fedcore.transport.flight`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow.flight as flight
import pytest
import yaml
from cryptography import x509

from fedcore.cli import main
from fedcore.config import load_config
from fedcore.errors import CertificateRefused, ConfigError
from fedcore.protocol.messages import Message
from fedcore.transport.flight import ACTION_MAX_BYTES, UNLIMITED_MESSAGES, AgentServer, FlightTransport
from fedcore.transport.guard import envelope
from fedcore.transport.tls import (
    TLSError,
    init_ca,
    init_master_ca,
    issue_certificate,
    issued_by,
    server_name,
)
from tests.transport.test_refusals import Counter

BODY = 8 << 20
"""A member's oversized `do_action` body: the issue's attack sent 300 MB; 8 MB shows the same path."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """The consortium CA with institutions "a" and "b", the master CA with the master, in one folder."""
    certs = tmp_path_factory.mktemp("certs")
    init_ca(certs)
    init_master_ca(certs)
    issue_certificate(certs, "master", certs, role="master")  # from the master CA, which the folder holds
    for name in ("a", "b"):
        issue_certificate(certs, name, certs)
    old = certs / "old"  # the master certificate of a consortium without a master CA
    old.mkdir()
    issue_certificate(certs, "master", old, role="master", ca="ca")
    return certs


def _agent(pki: Path, master_ca: bool = True) -> AgentServer:
    return AgentServer(Counter(), tls_cert=pki / "a.pem", tls_key=pki / "a.key", ca_cert=pki / "ca.pem",
                       master_ca=pki / "master-ca.pem" if master_ca else None)


def _client(pki: Path, server: AgentServer, name: str, folder: Path | None = None) -> flight.FlightClient:
    """A raw Flight client with `name`'s certificate: it can send any call, as a hostile peer would."""
    folder = folder or pki
    return flight.FlightClient(f"grpc+tls://127.0.0.1:{server.port}",
                               tls_root_certs=(pki / "ca.pem").read_bytes(),
                               cert_chain=(folder / f"{name}.pem").read_bytes(),
                               private_key=(folder / f"{name}.key").read_bytes(),
                               override_hostname=server_name("a"), generic_options=UNLIMITED_MESSAGES)


def _oversized_call(client: flight.FlightClient) -> None:
    list(client.do_action(flight.Action(envelope("ab" * 16, 1), b"\0" * BODY)))


def test_the_master_ca_signs_masters_only(pki) -> None:
    master = (pki / "master.pem").read_bytes()
    assert issued_by(master, (pki / "master-ca.pem").read_bytes())
    assert not issued_by(master, (pki / "ca.pem").read_bytes())
    assert issued_by((pki / "a.pem").read_bytes(), (pki / "ca.pem").read_bytes())
    assert issued_by((pki / "old" / "master.pem").read_bytes(), (pki / "ca.pem").read_bytes())
    with pytest.raises(TLSError, match="the master CA signs master certificates only, not institution 'c'"):
        issue_certificate(pki, "c", pki, ca="master-ca")


def test_a_members_oversized_call_is_refused_at_the_handshake_unread(pki, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="fedcore.transport.flight"):
        server = _agent(pki)
    try:
        assert server.master_ca and "no master CA" not in caplog.text
        client = _client(pki, server, "b")
        for _ in range(2):
            with pytest.raises(flight.FlightUnavailableError, match="Socket closed"):
                _oversized_call(client)
        client.close()
        # nothing reached Python: not the peer check (which counts refusals), not the budget, not the party
        assert (server.refused, server.budget.peak, server.party.calls) == (0, 0, 0)
        assert server.last_contact is None
        with FlightTransport({"a": f"grpc+tls://127.0.0.1:{server.port}"}, tls_cert=pki / "b.pem",
                             tls_key=pki / "b.key", ca_cert=pki / "ca.pem", keepalive_s=None) as transport:
            with pytest.raises(CertificateRefused,
                               match=r"cannot reach party 'a' at .*: the agent closed the connection after "
                                     r"the handshake: it refused this master's certificate \(this master's "
                                     r"certificate is from the consortium CA, which an agent with a master "
                                     r"CA \(tls.master_ca\) refuses"):
                transport.exchange({"a": Message("ping")})
        assert (server.refused, server.party.calls) == (0, 0)
    finally:
        server.shutdown()


def test_the_master_is_served_and_its_own_oversized_call_is_read_then_refused(pki) -> None:
    server = _agent(pki)
    try:
        endpoint = f"grpc+tls://127.0.0.1:{server.port}"
        with FlightTransport({"a": endpoint}, tls_cert=pki / "master.pem", tls_key=pki / "master.key",
                             ca_cert=pki / "ca.pem") as transport:
            assert transport.ping("a") == "a"
            reply = transport.exchange({"a": Message("hello", {}, {"x": np.arange(5.0)})})["a"]
            np.testing.assert_array_equal(reply.arrays["x"], np.arange(5.0)[::-1])
            transport.exchange({"a": Message("close")})
        # what remains: a master's certificate passes the handshake, so its oversized call is read whole
        client = _client(pki, server, "master")
        with pytest.raises(flight.FlightServerError,
                           match=rf"a message call of {BODY} bytes is over {ACTION_MAX_BYTES} bytes"):
            _oversized_call(client)
        client.close()
        assert server.refused == 1 and server.party.calls == 2
    finally:
        server.shutdown()


def test_without_a_master_ca_a_member_is_read_then_refused_and_the_agent_warns(pki, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="fedcore.transport.flight"):
        server = _agent(pki, master_ca=False)
    try:
        assert not server.master_ca
        assert ("agent 'a': no master CA (tls.master_ca), so every consortium member's certificate passes "
                "the TLS handshake") in caplog.text
        client = _client(pki, server, "b")
        with pytest.raises(flight.FlightUnauthorizedError,
                           match="agent 'a' serves only master 'master'; the client at .* presented the "
                                 "certificate of institution 'b'"):
            _oversized_call(client)  # gRPC read the whole body before the peer check ran
        client.close()
        assert server.refused == 1 and server.party.calls == 0
        old = pki / "old"  # the old configuration's master still works
        with FlightTransport({"a": f"grpc+tls://127.0.0.1:{server.port}"}, tls_cert=old / "master.pem",
                             tls_key=old / "master.key", ca_cert=pki / "ca.pem") as transport:
            assert transport.exchange({"a": Message("hello")})["a"].kind == "echo"
    finally:
        server.shutdown()


def test_a_master_certificate_from_the_consortium_ca_is_refused_by_an_agent_with_a_master_ca(pki) -> None:
    server = _agent(pki)
    old = pki / "old"
    try:
        with FlightTransport({"a": f"grpc+tls://127.0.0.1:{server.port}"}, tls_cert=old / "master.pem",
                             tls_key=old / "master.key", ca_cert=pki / "ca.pem") as transport:
            with pytest.raises(CertificateRefused, match="issue it from the master CA"):
                transport.exchange({"a": Message("hello")})
    finally:
        server.shutdown()
    assert server.party.calls == 0


def _config(pki: Path, tmp_path: Path, **tls) -> Path:
    raw = {"federation": "f", "consortium_key": {"env": "KEY"},
           "tls": {"ca": str(pki / "ca.pem"), "master_cert": str(pki / "master.pem"),
                   "master_key": str(pki / "master.key"), **tls},
           "institutions": [{"name": "a", "data": "a.csv", "id_column": "id", "label": "y",
                             "endpoint": "grpc+tls://127.0.0.1:1", "cert": str(pki / "a.pem"),
                             "key": str(pki / "a.key")}]}
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_config_names_the_master_ca_and_the_master_checks_its_certificate_against_it(pki,
                                                                                        tmp_path) -> None:
    config = load_config(_config(pki, tmp_path, master_ca=str(pki / "master-ca.pem")))
    assert config.tls["master_ca"] == pki / "master-ca.pem"
    FlightTransport.from_config(config).close()
    with pytest.raises(ConfigError, match=r"unknown tls setting 'master-ca'; did you mean 'master_ca'\?"):
        load_config(_config(pki, tmp_path, **{"master-ca": "x.pem"}))
    wrong = load_config(_config(pki, tmp_path, master_ca=str(pki / "master-ca.pem"),
                                master_cert=str(pki / "old" / "master.pem"),
                                master_key=str(pki / "old" / "master.key")))
    with pytest.raises(ConfigError, match=r"tls.master_cert .*old/master.pem was not issued by tls.master_ca "
                                          r".*master-ca.pem, so every agent would refuse it"):
        FlightTransport.from_config(wrong)


def test_the_agent_built_from_the_config_trusts_only_the_master_ca(pki, tmp_path, monkeypatch) -> None:
    from fedcore.commands.agent import build_agent

    monkeypatch.setenv("KEY", "a test consortium key")

    (tmp_path / "a.csv").write_text("id,y,x\n1,0,0.5\n2,1,1.5\n")
    path = _config(pki, tmp_path, master_ca=str(pki / "master-ca.pem"))
    raw = yaml.safe_load(path.read_text())
    raw["institutions"][0]["endpoint"] = "grpc+tls://127.0.0.1:0"
    path.write_text(yaml.safe_dump(raw))
    server = build_agent(load_config(path), "a")
    try:
        assert server.master_ca
        client = _client(pki, server, "b")
        with pytest.raises(flight.FlightUnavailableError):
            list(client.do_action(flight.Action("ping", b"")))
        client.close()
        assert server.refused == 0
    finally:
        server.shutdown()


def test_certs_init_makes_both_cas_and_issue_signs_a_master_with_the_master_ca(tmp_path, capsys) -> None:
    d = tmp_path / "certs"
    assert main(["certs", "init", "--dir", str(d)]) == 0
    out = capsys.readouterr().out
    assert "consortium CA:" in out and "master CA:" in out and "as tls.master_ca" in out
    assert main(["certs", "issue", "master", "--dir", str(d)]) == 0
    assert "signed by the master CA" in capsys.readouterr().out
    assert main(["certs", "issue", "bank", "--dir", str(d)]) == 0
    assert "signed by the consortium CA" in capsys.readouterr().out
    master = x509.load_pem_x509_certificate((d / "master.pem").read_bytes())
    master.verify_directly_issued_by(x509.load_pem_x509_certificate((d / "master-ca.pem").read_bytes()))
    bank = x509.load_pem_x509_certificate((d / "bank.pem").read_bytes())
    bank.verify_directly_issued_by(x509.load_pem_x509_certificate((d / "ca.pem").read_bytes()))


def test_an_existing_consortium_adds_a_master_ca(tmp_path, capsys) -> None:
    d = tmp_path / "certs"
    init_ca(d)
    assert main(["certs", "issue", "master", "--dir", str(d)]) == 0
    captured = capsys.readouterr()
    assert "signed by the consortium CA" in captured.out
    assert (f"warning: {d} holds no master-ca.pem, so this master certificate comes from the consortium CA"
            in captured.err and f"`fedforest certs master-ca --dir {d}`" in captured.err)
    assert main(["certs", "master-ca", "--dir", str(d)]) == 0
    assert main(["certs", "issue", "master", "--dir", str(d), "--force"]) == 0
    captured = capsys.readouterr()
    assert "signed by the master CA" in captured.out and "warning" not in captured.err
    assert issued_by((d / "master.pem").read_bytes(), (d / "master-ca.pem").read_bytes())
    assert main(["certs", "master-ca", "--dir", str(d)]) == 1
    assert "refusing to overwrite" in capsys.readouterr().err

