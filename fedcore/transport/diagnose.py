"""Say why a mutual-TLS connection to an agent fails, in words an operator can act on.

gRPC reports every failed TLS handshake as "Socket closed"; this module repeats the handshake with
Python's `ssl` and the same certificates to tell apart: nothing listening, an agent whose certificate
the consortium CA did not sign (or that belongs to another institution), and an agent that refuses
this master's certificate. An agent checks the master's certificate against its master CA
(`tls.master_ca`), or against the consortium CA if it has none; the diagnosis says which CA signed this
master's certificate.
"""

from __future__ import annotations

import os
import socket
import ssl
import tempfile
from typing import NamedTuple
from urllib.parse import urlparse

from cryptography import x509

from fedcore.transport.tls import certificate_identity, issued_by

_AGENT_REFUSED = ("unknown ca", "bad certificate", "certificate required", "certificate expired",
                  "certificate revoked", "certificate unknown", "unsupported certificate", "decrypt error")


class Diagnosis(NamedTuple):
    """Why a connection fails; `certificate` when a certificate was refused, which no retry can fix."""

    reason: str
    certificate: bool = False


def explain_connection_failure(endpoint: str, *, cert: bytes, key: bytes, ca: bytes, party: str,
                               timeout_s: float = 3.0) -> Diagnosis | None:
    """Why a connection to `party`'s agent at `endpoint` fails, or None when neither TCP nor TLS is it."""
    parsed = urlparse(endpoint)
    host, port = parsed.hostname or "", parsed.port
    if not host or port is None:
        return None
    try:
        raw = socket.create_connection((host, port), timeout=timeout_s)
    except ConnectionRefusedError:
        return Diagnosis("nothing listens there: is the agent running?")
    except OSError as exc:
        return Diagnosis(f"cannot open a connection: {exc.strerror or exc}")
    with raw, tempfile.TemporaryDirectory() as scratch:
        context = _client_context(cert, key, ca, scratch)
        try:
            with context.wrap_socket(raw, server_hostname=host) as tls:
                problem = _agent_identity_problem(tls.getpeercert(binary_form=True), party)
                if problem:
                    return problem
                return _refusal_after_handshake(tls, timeout_s, _master_signer(cert, ca))
        except ssl.SSLCertVerificationError as exc:
            return Diagnosis(f"the agent's certificate does not verify against the consortium CA "
                             f"({exc.verify_message}): it was issued by another CA or has expired", True)
        except ssl.SSLError as exc:
            return _refusal_reason(exc, _master_signer(cert, ca))
        except OSError:
            return None


def _client_context(cert: bytes, key: bytes, ca: bytes, scratch: str) -> ssl.SSLContext:
    """A client context with the master's certificate; `ssl` reads keys only from files, kept private."""
    cert_path, key_path = os.path.join(scratch, "cert.pem"), os.path.join(scratch, "key.pem")
    for path, pem in ((cert_path, cert), (key_path, key)):
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as handle:
            handle.write(pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # the agent's name is checked against its certificate's identity below
    context.load_verify_locations(cadata=ca.decode())
    context.load_cert_chain(cert_path, key_path)
    context.set_alpn_protocols(["h2"])
    return context


def _agent_identity_problem(der: bytes | None, party: str) -> Diagnosis | None:
    """The agent's certificate must name the institution the config says lives at this endpoint."""
    if der is None:
        return Diagnosis("the agent presented no certificate", True)
    from cryptography.hazmat.primitives.serialization import Encoding

    identity = certificate_identity(x509.load_der_x509_certificate(der).public_bytes(Encoding.PEM))
    if identity != (party, "institution"):
        who = f"{identity[1]} {identity[0]!r}" if identity else "no fedforest identity"
        return Diagnosis(f"the agent there presents the certificate of {who}, not of institution {party!r}",
                         True)
    return None


def _master_signer(cert: bytes, ca: bytes) -> str:
    """Which CA signed this master's certificate, and what an agent then does with it."""
    if issued_by(cert, ca):
        return ("this master's certificate is from the consortium CA, which an agent with a master CA "
                "(tls.master_ca) refuses: issue it from the master CA (`fedforest certs issue master`)")
    return ("an agent accepts only a master certificate signed by its master CA (tls.master_ca) or, without "
            "one, by the consortium CA; this one is signed by neither it trusts, or has expired")


def _refusal_after_handshake(tls: ssl.SSLSocket, timeout_s: float, signer: str) -> Diagnosis | None:
    """The server's verdict on our client certificate, read after the TLS 1.3 handshake.

    With TLS 1.3 the server judges the client certificate after the handshake, so its verdict comes on the
    first read: an alert, or (gRPC) the connection closed without a word. Data (HTTP/2 settings) or silence
    means it accepted us.
    """
    tls.settimeout(min(timeout_s, 1.0))
    try:
        if tls.recv(1) == b"":
            return Diagnosis("the agent closed the connection after the handshake: it refused this master's "
                             f"certificate ({signer})", True)
    except ssl.SSLError as exc:
        return _refusal_reason(exc, signer)
    except OSError:
        return None
    return None


def _refusal_reason(exc: ssl.SSLError, signer: str) -> Diagnosis:
    reason = (exc.reason or str(exc)).replace("_", " ").lower()
    if any(marker in reason for marker in _AGENT_REFUSED):
        return Diagnosis(f"the agent refused this master's certificate ({reason}): {signer}", True)
    return Diagnosis(f"TLS handshake failed: {reason}", True)
