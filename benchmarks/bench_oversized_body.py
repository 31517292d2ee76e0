"""An agent's peak memory under the oversized `do_action` attack, with and without a master CA (issue #27).

A real agent process (`fedforest agent serve`, over Arrow Flight with mutual TLS, certificates made by
`fedforest certs`) is sent two 300 MB `do_action` calls, first by another institution of the consortium,
then by the master. Its peak resident memory (VmHWM in /proc/<pid>/status) and its resident memory
(VmRSS) are read before and after each call. Each (configuration, sender) pair gets a fresh agent process,
so each peak is its own:

* reference: the agent verifies client certificates against the consortium CA (no `tls.master_ca`), so
  every member passes the TLS handshake and gRPC reads the whole body before the agent refuses it;
* master CA: the agent verifies client certificates against the master CA alone (`tls.master_ca`), so a
  member fails the handshake; the master still passes it, and its oversized body is read, then refused.

With the master CA, a member is also tried as a raw TLS client that writes 300 MB the moment its own side
of the handshake is done (a client that does not wait for gRPC), to show what the agent takes in before it
closes the connection.

    .venv/bin/python -m benchmarks.bench_oversized_body [--mb 300] [--calls 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.flight as flight
import yaml

from benchmarks.markdown import markdown_table
from fedcore.cli import main as fedforest
from fedcore.transport.flight import UNLIMITED_MESSAGES
from fedcore.transport.guard import envelope
from fedcore.transport.tls import issue_certificate, server_name

MiB = 1 << 20


def make_federation(work: Path) -> dict[str, Path]:
    """Certificates (`fedforest certs`), a small data file and two configs: with and without a master CA."""
    certs = work / "certs"
    for argv in (["certs", "init", "--dir", certs], ["certs", "issue", "master", "--dir", certs],
                 ["certs", "issue", "bank", "--dir", certs], ["certs", "issue", "insurer", "--dir", certs]):
        assert fedforest([str(a) for a in argv]) == 0
    # the reference configuration's master: a certificate from the consortium CA, as before the master CA
    issue_certificate(certs, "master", work / "old", role="master", ca="ca")
    (work / "consortium.key").write_text("a benchmark consortium key\n")
    (work / "data").mkdir()
    pd.DataFrame({"customer_id": range(100), "x": [0.5 * i for i in range(100)],
                  "y": [i % 2 for i in range(100)]}).to_parquet(work / "data" / "bank.parquet")
    configs = {}
    for name, tls in (("reference", {}), ("master CA", {"master_ca": str(certs / "master-ca.pem")})):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        raw = {"federation": "bench", "consortium_key": {"file": str(work / "consortium.key")},
               "tls": {"ca": str(certs / "ca.pem"), **tls},
               "institutions": [
                   {"name": "bank", "data": str(work / "data" / "bank.parquet"), "id_column": "customer_id",
                    "label": "y", "endpoint": f"grpc+tls://127.0.0.1:{port}", "cert": str(certs / "bank.pem"),
                    "key": str(certs / "bank.key")},
                   {"name": "insurer", "data": str(work / "data" / "bank.parquet"),
                    "id_column": "customer_id", "endpoint": "grpc+tls://127.0.0.1:1",
                    "cert": str(certs / "insurer.pem"), "key": str(certs / "insurer.key")}]}
        path = work / f"{name.replace(' ', '-')}.yaml"
        path.write_text(yaml.safe_dump(raw))
        configs[name] = path
    return {"certs": certs, "old": work / "old", **configs}


def memory(pid: int) -> dict[str, float]:
    """The process's peak and current resident memory, MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def client(endpoint: str, certs: Path, cert_dir: Path, name: str) -> flight.FlightClient:
    """A raw Flight client with `name`'s certificate, which sends whatever it is given."""
    return flight.FlightClient(endpoint, tls_root_certs=(certs / "ca.pem").read_bytes(),
                               cert_chain=(cert_dir / f"{name}.pem").read_bytes(),
                               private_key=(cert_dir / f"{name}.key").read_bytes(),
                               override_hostname=server_name("bank"), generic_options=UNLIMITED_MESSAGES)


def start_agent(config: Path, work: Path) -> tuple[subprocess.Popen, str]:
    """`fedforest agent serve` for the bank; returns the process once it says it is serving."""
    log_path = work / f"agent-{config.stem}.log"
    with open(log_path, "w") as log:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen([sys.executable, "-m", "fedcore.cli", "agent", "serve", "--config",
                                    str(config), "--institution", "bank"], stdout=log,
                                   stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while " serving on " not in log_path.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(log_path.read_text())
        time.sleep(0.1)
    endpoint = yaml.safe_load(config.read_text())["institutions"][0]["endpoint"]
    time.sleep(1.0)  # settle
    return process, endpoint


def flight_call(endpoint: str, certs: Path, cert_dir: Path, name: str, body: pa.Buffer) -> str:
    """One oversized do_action; what the sender saw (the error class and first words)."""
    sender = client(endpoint, certs, cert_dir, name)
    try:
        list(sender.do_action(flight.Action(envelope("ab" * 16, 1, "bench"), body)))
        return "answered"
    except flight.FlightError as exc:
        reason = str(exc).split(". Detail")[0].split("error, with message: ")[-1]
        return f"{type(exc).__name__}: {reason[:60]}{'...' if len(reason) > 60 else ''}"
    finally:
        sender.close()


def raw_tls_write(endpoint: str, certs: Path, name: str, size: int) -> str:
    """Write `size` bytes over TLS as soon as the client's side of the handshake is done."""
    host, port = endpoint.rsplit("//", 1)[1].split(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(certs / "ca.pem")
    context.load_cert_chain(certs / f"{name}.pem", certs / f"{name}.key")
    context.set_alpn_protocols(["h2"])
    sent, block = 0, b"\0" * MiB
    try:
        with socket.create_connection((host, int(port)), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname=host) as tls:
            while sent < size:
                tls.sendall(block)
                sent += len(block)
        return f"all {sent // MiB} MiB written"
    except (OSError, ssl.SSLError) as exc:
        return f"{type(exc).__name__} after {sent // MiB} MiB written"


def attack(config: Path, work: Path, pki: dict[str, Path], sender: str, body: pa.Buffer, calls: int) -> dict:
    """A fresh agent under `calls` oversized calls from `sender`; its memory before and after each."""
    process, endpoint = start_agent(config, work)
    try:
        rows = {"before": memory(process.pid)}
        outcome = ""
        for i in range(calls):
            if sender == "member":
                outcome = flight_call(endpoint, pki["certs"], pki["certs"], "insurer", body)
            elif sender == "member, raw TLS":
                outcome = raw_tls_write(endpoint, pki["certs"], "insurer", body.size)
            else:
                cert_dir = pki["old"] if config.stem == "reference" else pki["certs"]
                outcome = flight_call(endpoint, pki["certs"], cert_dir, "master", body)
            time.sleep(1.0)
            rows[f"after {i + 1}"] = memory(process.pid)
        alive = process.poll() is None
    finally:
        process.terminate()
        process.wait(timeout=30)
    return {"memory": rows, "outcome": outcome, "alive": alive}


def main() -> None:
    """Run every (configuration, sender) pair and print the agent's peak memory against the reference."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=300, help="size of each oversized body (MB, default 300)")
    parser.add_argument("--calls", type=int, default=2, help="oversized calls per agent (default 2)")
    args = parser.parse_args()
    body = pa.py_buffer(b"\0" * (args.mb * 1_000_000))
    cases = [("reference", "member"), ("master CA", "member"), ("master CA", "member, raw TLS"),
             ("reference", "master"), ("master CA", "master")]
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        pki = make_federation(work)
        for config, sender in cases:
            results[config, sender] = attack(pki[config], work, pki, sender, body, args.calls)
            print(config, sender, results[config, sender], flush=True)
    reference = results["reference", "member"]["memory"]
    growth_ref = reference[f"after {args.calls}"]["VmHWM"] - reference["before"]["VmHWM"]
    rows = []
    for (config, sender), result in results.items():
        m = result["memory"]
        growth = m[f"after {args.calls}"]["VmHWM"] - m["before"]["VmHWM"]
        rows.append({"agent": config, "sender": sender, "what the sender saw": result["outcome"],
                     "peak before MiB": m["before"]["VmHWM"],
                     **{f"peak after {i + 1} MiB": m[f"after {i + 1}"]["VmHWM"] for i in range(args.calls)},
                     "RSS after MiB": m[f"after {args.calls}"]["VmRSS"],
                     "peak growth vs reference": f"{growth / growth_ref:.3f}" if growth_ref else "-"})
    print(f"\nMachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; pyarrow "
          f"{pa.__version__}; {args.calls} do_action calls of {args.mb} MB each, one fresh agent per row\n")
    print(markdown_table(rows, digits=0))


if __name__ == "__main__":
    main()
