"""nginx, when installed: a fixed-answer HTTPS upstream, and a plain mTLS reverse proxy.

Both run ``worker_processes 1`` (the gatekeeper is one process too), ``daemon off``, with
every path inside the run's temporary directory. Skipped when ``nginx`` is not on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from bench.fixtures import SLICES, TOKEN, Pki, item_slice, list_document, slice_protobuf

__all__ = ["find_nginx", "start_fixed_upstream", "start_reverse_proxy"]

_COMMON = """
worker_processes 1;
daemon off;
{user}
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  client_max_body_size 8m;
  client_body_buffer_size 8m;
  ssl_session_cache off;
{servers}
}}
"""

# A write's answer is in protobuf when Accept prefers it (client-go), else JSON (the
# gatekeeper's dry run of a protobuf body asks for JSON).
_FIXED = """
  map $http_accept $answer {{
    "~^application/vnd\\.kubernetes\\.protobuf" pb;
    default json;
  }}
  server {{
    listen 127.0.0.1:{port} ssl backlog=2048;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    root {www};
    types {{ application/vnd.kubernetes.protobuf pb; }}
    default_type application/json;
    location = {slices} {{
      rewrite ^ /fixed/list.json break;
      error_page 405 =201 /fixed/created.$answer;
    }}
    location {slices}/ {{
      rewrite ^ /fixed/slice.json break;
      error_page 405 =200 /fixed/slice.$answer;
    }}
    location /fixed/ {{ internal; }}
  }}
"""

_PROXY = """
  upstream fixed {{ server 127.0.0.1:{upstream}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port} ssl backlog=2048;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_client_certificate {ca};
    ssl_verify_client on;
    location / {{
      proxy_pass https://fixed;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Authorization "Bearer {token}";
      proxy_ssl_trusted_certificate {ca};
      proxy_ssl_verify on;
      proxy_ssl_name localhost;
      proxy_ssl_session_reuse on;
    }}
  }}
"""


def find_nginx() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None
    )


def _start(binary: str, workdir: Path, servers: str, log: Path) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    user = "user root;" if os.geteuid() == 0 else ""
    conf = workdir / "nginx.conf"
    conf.write_text(_COMMON.format(user=user, dir=workdir, servers=servers))
    with log.open("ab") as out:
        return subprocess.Popen(
            [binary, "-c", str(conf), "-p", str(workdir), "-e", str(workdir / "error.log")],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def start_fixed_upstream(
    binary: str, workdir: Path, port: int, pki: Pki, list_count: int
) -> subprocess.Popen:
    """Static answers: a slice for get/update, 201 for a create, a list of ``list_count``;
    a write that prefers protobuf is answered in protobuf. Fixed, unlike
    ``bench.upstream_app``'s: a create's answer (and the JSON dry run of a protobuf create)
    names ``node-a-bench``, not the name sent."""
    www = workdir / "www" / "fixed"
    www.mkdir(parents=True, exist_ok=True)
    (www / "slice.json").write_text(json.dumps(item_slice()))
    (www / "created.json").write_text(json.dumps(item_slice()))
    (www / "slice.pb").write_bytes(slice_protobuf(item_slice()))
    (www / "created.pb").write_bytes(slice_protobuf(item_slice()))
    (www / "list.json").write_bytes(list_document(list_count))
    servers = _FIXED.format(
        port=port, cert=pki.server_cert, key=pki.server_key, www=workdir / "www", slices=SLICES
    )
    return _start(binary, workdir, servers, workdir / "out.log")


def start_reverse_proxy(
    binary: str, workdir: Path, port: int, upstream_port: int, pki: Pki
) -> subprocess.Popen:
    """A plain reverse proxy: mTLS in, HTTPS keep-alive out, the node token added, no checks."""
    servers = _PROXY.format(
        port=port,
        upstream=upstream_port,
        cert=pki.server_cert,
        key=pki.server_key,
        ca=pki.ca,
        token=TOKEN,
    )
    return _start(binary, workdir, servers, workdir / "out.log")
