#!/usr/bin/env python3
"""cutproxy.py — a TCP proxy for the e2e tests that cuts HTTP connections
mid-body (python3 standard library only).

    cutproxy.py --target HOST:PORT --url-file F --log F [--cut RULE]...
                [--cut-request RULE]... [--status CODE[@K],only=TEXT]...

It listens on 127.0.0.1 (a free port; its URL "http://127.0.0.1:PORT" is
written to F once it accepts) and forwards every connection to TARGET byte
for byte. It follows the HTTP/1.1 messages in both directions (requests and
their bodies by Content-Length; responses by Content-Length, none for HEAD,
1xx, 204 and 304) so that, on a keep-alive connection too, it knows where
each response body starts. A RULE is N[@K][,only=TEXT][,resumed]: it cuts
the first K (default 1) responses whose body is longer than N bytes, whose
request line holds TEXT, and (with "resumed") whose request's Range starts
past byte 0 -- the data pieces and resumed requests of a download, not the
header probe of a safetensors file. A cut forwards the headers and the first
N body bytes, then shuts down both sides. The first rule that matches and
has cuts left applies. Every response is logged, one line:

    GET /org/repo/resolve/REV/PATH range=bytes=S-E status=206 body=LEN [cut=N]

--cut-request N[@K][,only=TEXT] cuts the first K requests whose body is longer
than N bytes (an upload) after N body bytes: the server gets a truncated
request and the client a closed connection, logged "... cut-request=N".
--status CODE[@K],only=TEXT answers the first K matching requests itself
with HTTP CODE and an S3 error document (503 SlowDown, else InternalError),
then closes the connection; the request is not forwarded (its body is read
first unless it waits for "100 Continue"). Logged "... status=CODE injected".

A message the proxy cannot follow (chunked, no length) is passed through as
is for the rest of its connection, logged as "unframed". SIGTERM stops it.
"""
import argparse
import collections
import os
import signal
import socket
import sys
import threading

lock = threading.Lock()
rules = []
request_rules = []
status_rules = []
args = None
logf = None


def log(line):
    with lock:
        logf.write(line + "\n")
        logf.flush()


def parse_head(raw):
    """b"START\r\nK: V\r\n..." -> (start line, {lower key: value})."""
    lines = raw.decode("latin-1").split("\r\n")
    hdrs = {}
    for l in lines[1:]:
        if ":" in l:
            k, v = l.split(":", 1)
            hdrs[k.strip().lower()] = v.strip()
    return lines[0], hdrs


class Stream:
    """Reads from a socket with a buffer; read_head / take for framing."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def fill(self):
        try:
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        self.buf += data
        return bool(data)

    def read_head(self):
        """The bytes of one message head (through the blank line), or None at EOF."""
        while True:
            i = self.buf.find(b"\r\n\r\n")
            if i >= 0:
                head, self.buf = self.buf[: i + 4], self.buf[i + 4 :]
                return head
            if not self.fill():
                return None

    def chunks(self, n):
        """Yields up to n body bytes as they come."""
        while n > 0:
            if not self.buf and not self.fill():
                return
            part, self.buf = self.buf[:n], self.buf[n:]
            n -= len(part)
            yield part


def close_both(a, b):
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def take_rule(rules_of_kind, line, length, start=-1):
    """The first rule of a list that applies to a message (one use taken), or
    None: more than "after" body bytes, "only" in the request line, and for a
    "resumed" rule a Range starting past byte 0."""
    with lock:
        for r in rules_of_kind:
            if r["left"] == 0 or length <= r["after"]:
                continue
            if r["only"] and r["only"] not in line:
                continue
            if r["resumed"] and start <= 0:
                continue
            r["left"] -= 1
            return r
    return None


ERROR_DOC = ('<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code>'
             '<Message>injected by cutproxy</Message></Error>')


def pump_requests(client, server, pending, cond):
    src = Stream(client)
    try:
        while True:
            head = src.read_head()
            if head is None:
                break
            line, hdrs = parse_head(head)
            method = line.split(" ", 1)[0]
            length = int(hdrs.get("content-length", "0") or 0)
            injected = take_rule(status_rules, line, 0)
            if injected:
                if "100-continue" not in hdrs.get("expect", "").lower():
                    for _ in src.chunks(length):
                        pass
                code = injected["code"]
                body = (ERROR_DOC % ("SlowDown" if code == 503 else "InternalError")).encode()
                client.sendall(b"HTTP/1.1 %d Injected\r\nContent-Type: application/xml\r\n"
                               b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (code, len(body)) + body)
                log("%s status=%d injected" % (line.rsplit(" ", 1)[0], code))
                close_both(client, server)
                return
            cut = take_rule(request_rules, line, length)
            if cut:
                server.sendall(head)
                sent = 0
                for part in src.chunks(cut["after"]):
                    server.sendall(part)
                    sent += len(part)
                log("%s body=%d cut-request=%d" % (line.rsplit(" ", 1)[0], length, sent))
                close_both(client, server)
                return
            with cond:
                pending.append((method, line.rsplit(" ", 1)[0], hdrs.get("range", "")))
                cond.notify()
            server.sendall(head)
            if "chunked" in hdrs.get("transfer-encoding", "").lower():
                log("unframed request " + line)
                while src.buf or src.fill():
                    server.sendall(src.buf)
                    src.buf = b""
                break
            for part in src.chunks(length):
                server.sendall(part)
    except OSError:
        pass
    try:
        server.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    with cond:
        pending.append(None)
        cond.notify()


def parse_rule(text):
    rule = {"after": -1, "left": 1, "only": "", "resumed": False}
    parts = text.split(",")
    n, _, k = parts[0].partition("@")
    rule["after"] = int(n)
    if k:
        rule["left"] = int(k)
    for p in parts[1:]:
        if p.startswith("only="):
            rule["only"] = p[5:]
        elif p == "resumed":
            rule["resumed"] = True
        else:
            raise SystemExit("cutproxy: bad rule '%s'" % text)
    return rule


def wants_cut(line, rng, length):
    """The number of body bytes to forward before cutting, or -1."""
    start = -1
    if rng.startswith("bytes="):
        s = rng[6:].split("-", 1)[0]
        start = int(s) if s.isdigit() else -1
    r = take_rule(rules, line, length, start)
    return r["after"] if r else -1


def pump_responses(client, server, pending, cond):
    src = Stream(server)
    try:
        while True:
            head = src.read_head()
            if head is None:
                break
            status_line, hdrs = parse_head(head)
            parts = status_line.split(" ")
            status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            if 100 <= status < 200:  # an interim answer: the real one follows
                client.sendall(head)
                continue
            with cond:
                while not pending:
                    cond.wait()
                req = pending.popleft()
            method, line, rng = req if req else ("?", "? (no request)", "")
            desc = "%s%s status=%d" % (line, " range=" + rng if rng else "", status)
            if method == "HEAD" or status in (204, 304):
                length = 0
            elif "content-length" in hdrs:
                length = int(hdrs["content-length"])
            else:
                log(desc + " unframed")
                client.sendall(head)
                while src.buf or src.fill():
                    client.sendall(src.buf)
                    src.buf = b""
                break
            cut = wants_cut(line, rng, length)
            if cut >= 0:
                client.sendall(head)
                sent = 0
                for part in src.chunks(cut):
                    client.sendall(part)
                    sent += len(part)
                log("%s body=%d cut=%d" % (desc, length, sent))
                close_both(client, server)
                return
            client.sendall(head)
            sent = 0
            for part in src.chunks(length):
                client.sendall(part)
                sent += len(part)
            log("%s body=%d%s" % (desc, length, "" if sent == length else " short=%d" % sent))
            if sent < length:
                break
    except OSError:
        pass
    close_both(client, server)


def serve_one(client):
    try:
        host, port = args.target.rsplit(":", 1)
        server = socket.create_connection((host, int(port)))
    except OSError as e:
        log("cannot connect to %s: %s" % (args.target, e))
        client.close()
        return
    pending = collections.deque()
    cond = threading.Condition()
    t = threading.Thread(target=pump_requests, args=(client, server, pending, cond), daemon=True)
    t.start()
    pump_responses(client, server, pending, cond)
    t.join()
    client.close()
    server.close()


def main():
    global args, logf
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--url-file", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--cut", action="append", default=[], metavar="RULE")
    p.add_argument("--cut-request", action="append", default=[], metavar="RULE")
    p.add_argument("--status", action="append", default=[], metavar="CODE[@K],only=TEXT")
    args = p.parse_args()
    rules.extend(parse_rule(r) for r in args.cut)
    request_rules.extend(parse_rule(r) for r in args.cut_request)
    for text in args.status:
        r = parse_rule(text)
        if r["resumed"]:
            raise SystemExit("cutproxy: --status takes no 'resumed'")
        r["code"], r["after"] = r["after"], -1
        status_rules.append(r)
    logf = open(args.log, "a")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    tmp = args.url_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("http://127.0.0.1:%d" % ls.getsockname()[1])
    os.rename(tmp, args.url_file)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=serve_one, args=(c,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
