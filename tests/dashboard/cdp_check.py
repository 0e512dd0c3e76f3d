"""Loads the ratemesh dashboard in headless Chromium over the DevTools protocol and checks it.

Standard library only (a minimal WebSocket client is below). Usage:

    cdp_check.py DEVTOOLS_PORT PAGE_URL SCREENSHOT_PATH EXPECTED_MEMBERS KEY... [--audit POLICY...]

Fails (exit 1, the reason on stderr) unless, within the time bound:
- the page loads with no console error or warning, no uncaught exception, no browser log error;
- every network request goes to the page's own origin (or is a data: URL);
- the members table lists EXPECTED_MEMBERS members, all live, with ring shares;
- the top-keys table lists every KEY among its first len(KEY) rows;
- the rate chart is drawn (an <svg> per policy) and the page refreshed itself at least twice;
- the audit panel (GET /v1/audit) has a row for every AUDIT_POLICY with its figures (window,
  admitted / ideal with hits admitted, percentages, the worst window's ratio, incomplete windows),
  a row is marked over the bound exactly when its over-admission exceeds 2 %, every member
  answered, and the worst-keys table lists keys with their owner among the members;
- the markup keeps its accessibility basics: lang, labelled selects, header cells with scope,
  table captions, an accessible name for every chart.
Then writes a PNG screenshot (1280×900, a laptop screen) to SCREENSHOT_PATH.
"""

import base64
import json
import os
import re
import socket
import struct
import sys
import time
import urllib.parse
import urllib.request

WAIT_S = 45


class WebSocket:
    """A minimal RFC 6455 client: text frames out (masked), whole frames in."""

    def __init__(self, url):
        parts = urllib.parse.urlparse(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=WAIT_S)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {parts.path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise RuntimeError("websocket handshake: connection closed")
            head += chunk
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status:
            raise RuntimeError(f"websocket handshake refused: {status!r}")
        self.buffer = head.split(b"\r\n\r\n", 1)[1]

    def send(self, text):
        payload = text.encode()
        header = bytearray([0x81])
        if len(payload) < 126:
            header.append(0x80 | len(payload))
        elif len(payload) < 1 << 16:
            header.append(0x80 | 126)
            header += struct.pack(">H", len(payload))
        else:
            header.append(0x80 | 127)
            header += struct.pack(">Q", len(payload))
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(bytes(header) + mask + masked)

    def _read(self, n):
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise RuntimeError("websocket closed")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def recv(self):
        message = b""
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                (length,) = struct.unpack(">H", self._read(2))
            elif length == 127:
                (length,) = struct.unpack(">Q", self._read(8))
            payload = self._read(length)
            opcode = first & 0x0F
            if opcode == 0x8:
                raise RuntimeError("websocket closed by the browser")
            if opcode in (0x9, 0xA):
                continue  # ping/pong: nothing the checker needs
            message += payload
            if first & 0x80:
                return message.decode()


class DevTools:
    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0
        self.events = []

    def call(self, method, **params):
        self.next_id += 1
        call_id = self.next_id
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"evaluating {expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")


STATE_JS = r"""(() => {
  // Until the page (not about:blank, not a document being replaced or still parsed: every
  // element read below) is there: nothing yet.
  if (document.readyState === "loading" || !document.documentElement) return null;
  if (!document.getElementById("updated") || !document.getElementById("audit-caption")) return null;
  const rows = (id) => Array.from(document.querySelectorAll(`#${id} tbody tr`));
  const members = rows("members").map((r) => ({
    id: r.cells[0].textContent, status: r.cells[1].textContent, share: r.cells[2].textContent }));
  const keys = rows("top").map((r) => r.cells[1] ? r.cells[1].textContent : "");
  const a11y = {
    lang: document.documentElement.lang,
    unlabelledSelects: Array.from(document.querySelectorAll("select"))
      .filter((s) => !document.querySelector(`label[for="${s.id}"]`)).length,
    headersWithoutScope: Array.from(document.querySelectorAll("thead th")).filter((th) => !th.scope).length,
    tablesWithoutCaption: Array.from(document.querySelectorAll("table")).filter((t) => !t.caption).length,
    unnamedCharts: Array.from(document.querySelectorAll("svg")).filter((s) => !s.getAttribute("aria-label")).length,
  };
  const audit = rows("audit").map((r) => ({ over: r.className === "over-bound",
    cells: Array.from(r.cells, (c) => c.textContent) }));
  const auditKeys = rows("audit-keys").map((r) => ({ over: r.className === "over-bound",
    cells: Array.from(r.cells, (c) => c.textContent) }));
  return { members, keys, audit, auditKeys, auditCaption: document.getElementById("audit-caption").textContent,
           charts: document.querySelectorAll("#charts svg").length,
           updated: document.getElementById("updated").textContent, a11y };
})()"""


AUDIT_BOUND = 0.02
PERCENT = re.compile(r"^(\d+\.\d\d) %( ⚠ over the bound)?$")
RATIO = re.compile(r"^\d+\.\d\d ×$")
ADMITTED_IDEAL = re.compile(r"^(\d+) / (\d+)$")


def over_admission_problems(row, column):
    """Problems with a row's over-admission cell and its mark (over the bound, or not)."""
    m = PERCENT.match(row["cells"][column])
    if not m:
        return [f"over-admission {row['cells'][column]!r} is not a percentage"]
    over = float(m.group(1)) > AUDIT_BOUND * 100
    if over != row["over"] or over != bool(m.group(2)):
        return [f"over-admission {row['cells'][column]!r} marked {'over' if row['over'] else 'within'} the bound"]
    return []


def audit_problems(state, policies, members):
    """What the audit panel lacks; [] when every policy in POLICIES has a row with its figures."""
    if not policies:
        return []
    if f"{members} of {members} nodes" not in state["auditCaption"]:
        return [f"audit caption: {state['auditCaption']!r}"]
    problems, rows = [], {r["cells"][0]: r for r in state["audit"] if len(r["cells"]) == 7}
    for policy in policies:
        row = rows.get(policy)
        if row is None:
            problems.append(f"no audit row for {policy}")
            continue
        _, window, admitted_ideal, _, false_refusals, worst, incomplete = row["cells"]
        m = ADMITTED_IDEAL.match(admitted_ideal)
        if not (m and int(m.group(1)) > 0 and int(m.group(2)) > 0):
            problems.append(f"{policy}: admitted / ideal {admitted_ideal!r}")
        if not re.match(r"^\d+(\.\d)? (ms|s|min|h)$", window):
            problems.append(f"{policy}: window {window!r}")
        if not PERCENT.match(false_refusals) or "⚠" in false_refusals:
            problems.append(f"{policy}: false refusals {false_refusals!r}")
        if not RATIO.match(worst):
            problems.append(f"{policy}: worst window {worst!r}")
        if not re.match(r"^\d+ of [1-9]\d*$", incomplete):
            problems.append(f"{policy}: incomplete windows {incomplete!r}")
        problems += [f"{policy}: {p}" for p in over_admission_problems(row, 3)]
    keys = [r for r in state["auditKeys"] if len(r["cells"]) == 7]
    if not keys:
        problems.append("no worst keys")
    for row in keys:
        policy, key, owner, admitted_ideal, _, worst, incomplete = row["cells"]
        if not policy:
            problems.append(f"worst key {key!r} without its policy")
        if not key or not owner.isdigit() or not 1 <= int(owner) <= members:
            problems.append(f"worst key {key!r}: owner {owner!r}")
        if not ADMITTED_IDEAL.match(admitted_ideal) or not RATIO.match(worst) or not incomplete.isdigit():
            problems.append(f"worst key {key!r}: figures {row['cells']}")
        problems += [f"worst key {key!r}: {p}" for p in over_admission_problems(row, 4)]
    return problems


def main():
    port, page_url, screenshot, expected_members = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    expected_keys, audit_policies = sys.argv[5:], []
    if "--audit" in expected_keys:
        at = expected_keys.index("--audit")
        expected_keys, audit_policies = expected_keys[:at], expected_keys[at + 1:]
    origin = "{0.scheme}://{0.netloc}/".format(urllib.parse.urlparse(page_url))
    deadline = time.monotonic() + WAIT_S
    targets = None
    while targets is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as answer:
                targets = [t for t in json.load(answer) if t.get("type") == "page"]
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("chromium's DevTools endpoint did not answer")
            time.sleep(0.2)  # the interval of a bounded poll
    if not targets:
        raise SystemExit("chromium has no page target")
    tools = DevTools(WebSocket(targets[0]["webSocketDebuggerUrl"]))
    for domain in ("Runtime", "Log", "Network", "Page"):
        tools.call(f"{domain}.enable")
    tools.call("Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False)
    tools.call("Page.navigate", url=page_url)

    updates, state = set(), None
    while True:
        state = tools.evaluate(STATE_JS)
        if state and state["updated"].startswith("updated "):
            updates.add(state["updated"])
        members_ok = state and len(state["members"]) == expected_members and all(
            m["status"] == "live" and m["share"].endswith("%") for m in state["members"])
        keys_ok = state and sorted(state["keys"][: len(expected_keys)]) == sorted(expected_keys)
        audit = audit_problems(state, audit_policies, expected_members) if state else ["no page"]
        if members_ok and keys_ok and not audit and state["charts"] > 0 and len(updates) >= 2:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"the page did not show the cluster within {WAIT_S}s: {'; '.join(audit)} {json.dumps(state, ensure_ascii=False)}")
        time.sleep(0.25)  # the interval of a bounded poll
    # Drain the events that arrived meanwhile.
    tools.evaluate("1")

    problems, requests = [], []
    for event in tools.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
            problems.append(f"console.{params['type']}: {params.get('args')}")
        elif method == "Runtime.exceptionThrown":
            problems.append(f"exception: {params.get('exceptionDetails')}")
        elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
            problems.append(f"log {params['entry']['level']}: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        elif method == "Network.requestWillBeSent":
            requests.append(params["request"]["url"])
        elif method == "Network.loadingFailed":
            problems.append(f"request failed: {params.get('errorText')}")
    outside = [url for url in requests if not (url.startswith(origin) or url.startswith("data:"))]
    if outside:
        problems.append(f"requests outside the node: {outside}")
    a11y = state["a11y"]
    if a11y["lang"] != "en" or any(a11y[k] for k in a11y if k != "lang"):
        problems.append(f"accessibility basics: {a11y}")
    if problems:
        raise SystemExit("dashboard problems:\n  " + "\n  ".join(problems))

    shot = tools.call("Page.captureScreenshot", format="png")
    with open(screenshot, "wb") as out:
        out.write(base64.b64decode(shot["data"]))
    paths = sorted({urllib.parse.urlparse(url).path for url in requests})
    print(f"dashboard ok: {len(state['members'])} members live, top keys {state['keys'][:len(expected_keys)]}, "
          f"{state['charts']} chart(s), audit rows {[r['cells'] for r in state['audit']]} "
          f"and {len(state['auditKeys'])} worst key(s), {len(updates)} refreshes, {len(requests)} requests, all to {origin} "
          f"({', '.join(paths)}); screenshot {screenshot}")


if __name__ == "__main__":
    main()
