"""Issue 45, item 1: the shipped reverse-proxy configuration (``deploy/nginx.conf``) is what nginx
accepts, and serves the explorer over TLS: nginx's own ``-t`` check, then a real nginx in front
of the test server (ports, certificate and upstream rewritten to this machine's: a self-signed
certificate made with openssl) answering ``GET /`` with the page, and cutting off a client whose
headers do not arrive within its ``client_header_timeout``."""

from __future__ import annotations

import re
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "deploy" / "nginx.conf"


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: held open together while they are picked (one at a time the
    kernel may hand the same port out twice, and nginx then listens for TLS and plain HTTP on
    one port: a plain request got "400 Bad Request" instead of the redirect)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def nginx_bin() -> str:
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if path is None:
        pytest.fail("nginx not found: install it (apt-get install -y nginx-light), as the README's test command does")
    return path


def _site(tmp: Path, upstream: int, https: int, http: int) -> Path:
    """The shipped site configuration with this machine's ports, certificate and upstream."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", str(tmp / "key.pem"), "-out", str(tmp / "cert.pem")], check=True, capture_output=True)
    text = CONF.read_text()
    for old, new in (("server 127.0.0.1:8050;", f"server 127.0.0.1:{upstream};"),
                     ("listen 443 ssl http2;", f"listen 127.0.0.1:{https} ssl http2;"),
                     ("listen 80;", f"listen 127.0.0.1:{http};"),
                     ("/etc/ssl/certs/soapbox.pem", str(tmp / "cert.pem")),
                     ("/etc/ssl/private/soapbox.key", str(tmp / "key.pem"))):
        assert old in text, old  # (the shipped file still says what this test rewrites)
        text = text.replace(old, new)
    (tmp / "soapbox.conf").write_text(text)
    main = tmp / "nginx.conf"
    main.write_text(f"""
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{}}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {tmp}/soapbox.conf;
}}
""")
    return main


def test_nginx_accepts_the_shipped_configuration_and_serves_the_explorer(nginx_bin, app_url, tmp_path):
    upstream = urlparse(app_url).port
    https, http = _free_ports(2)
    main = _site(tmp_path, upstream, https, http)
    check = subprocess.run([nginx_bin, "-t", "-c", str(main), "-p", str(tmp_path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen([nginx_bin, "-c", str(main), "-p", str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        deadline = time.monotonic() + 60
        while True:
            try:
                raw = socket.create_connection(("127.0.0.1", https), timeout=10)
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read() if proc.poll() else ""
                time.sleep(0.2)
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            s.settimeout(120)
            s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 200") and b"<title>soapbox</title>" in data, data[:300]
        # plain HTTP is sent to HTTPS
        with socket.create_connection(("127.0.0.1", http), timeout=30) as s:
            s.sendall(b"GET /x HTTP/1.1\r\nHost: soapbox.example.org\r\nConnection: close\r\n\r\n")
            head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 301") and b"Location: https://soapbox.example.org/x" in head
        # a client whose headers trickle in is cut off (client_header_timeout), not waited for
        timeout_s = float(re.search(r"client_header_timeout (\d+)s;", CONF.read_text()).group(1))
        slow = ctx.wrap_socket(socket.create_connection(("127.0.0.1", https), timeout=10), server_hostname="localhost")
        slow.sendall(b"GET / HTTP/1.1\r\n")
        slow.settimeout(timeout_s + 60)  # (nginx closes it at its timeout; a server that waited would not)
        try:
            got = slow.recv(4096)
        except (ConnectionResetError, ssl.SSLError):
            got = b""
        assert got == b"" or got.startswith(b"HTTP/1.1 408"), got[:100]
        slow.close()
    finally:
        proc.terminate()
        proc.wait(30)
