"""A cheating iota miner, written outside the project on purpose.

This program is deliberately NOT the project's miner code: it shares no source with the Rust
crate. It speaks only the public HTTP API of an orchestrator, signs its requests with a
standard Bittensor wallet library (`bittensor-wallet`), hashes with the `blake3` package, and
encodes tensors with its own reading of the documented wire format. It never runs the model.
It exists so that the tests of the incentive (issue 42) do not depend on the miner's internals:
what a stranger can do with the API, this program does.

Cheats (`--cheat` takes a comma-separated list):
  outputs  noise | zeros | scaled | replayed  (noise when none is given)
  fake-loss             at the tail, report the public recent loss as its own
  silent-merge          never ask for merge tasks (no upload, no partitions)
  no-deliver            take the upload lease and the partitions, deliver nothing
  steer                 register throwaway hotkeys first so that the real key lands in --section
                        (and with --grind N, up to N fresh keys until one does; the orchestrator
                        draws a new key's section by its address, so with --forwarded-for each
                        fresh key also comes from a fresh address)
  honest-heartbeat-lie  report the public merged-state hash in the heartbeat
The default is the issue's cheater: noise,silent-merge,fake-loss,honest-heartbeat-lie.
With --flood N it only registers N fresh keys back to back and prints each answer.

Prints one JSON line per event on stdout; exits 0 on SIGTERM or after --seconds.
"""

import argparse
import hashlib
import json
import math
import random
import signal
import struct
import sys
import threading
import time
import urllib.error
import urllib.request
from array import array

import blake3
from bittensor_wallet import Keypair

OUTPUTS = ("noise", "zeros", "scaled", "replayed")
BEHAVIOURS = ("fake-loss", "silent-merge", "no-deliver", "steer", "honest-heartbeat-lie")
DEFAULT_CHEAT = "noise,silent-merge,fake-loss,honest-heartbeat-lie"
DTYPES = {"f32": 0, "bf16": 1, "int8": 2}
COUNTS = {"accepted": 0, "refused": 0, "errors": 0, "forwards": 0, "backwards": 0}


def emit(event, **fields):
    print(json.dumps({"event": event, "t": round(time.time(), 3), **fields}), flush=True)


def now_ms():
    return int(time.time() * 1000)


class Api:
    """Signed JSON over urllib. Message: METHOD path.sha256hex(body).timestamp_ms.signed_for."""

    def __init__(self, base, key, forwarded_for=None):
        self.base, self.key, self.run = base.rstrip("/"), key, ""
        self.retry_after = None
        # An X-Forwarded-For address, as a proxy in front of the orchestrator would add it:
        # where an attacker with many addresses comes from.
        self.forwarded_for = forwarded_for

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=30) as r:
            return json.loads(r.read())

    def post(self, path, body, key=None):
        key = key or self.key
        data = json.dumps(body, separators=(",", ":")).encode()
        ts = str(now_ms())
        message = f"POST {path}.{hashlib.sha256(data).hexdigest()}.{ts}.{self.run}"
        headers = {
            "Content-Type": "application/json",
            "X-Iota-Signature": "0x" + key.sign(message.encode()).hex(),
            "X-Iota-Timestamp": ts,
            "X-Iota-Hotkey": key.ss58_address,
            "X-Iota-Signed-For": self.run,
        }
        if self.forwarded_for:
            headers["X-Forwarded-For"] = self.forwarded_for
        req = urllib.request.Request(self.base + path, data=data, headers=headers, method="POST")
        self.retry_after = None
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            self.retry_after = e.headers.get("Retry-After")
            text = e.read().decode(errors="replace")
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, {"code": "unknown", "message": text[:200]}


def fetch(url, want_hash=None, byte_range=None):
    req = urllib.request.Request(url)
    if byte_range:
        req.add_header("Range", "bytes=%d-%d" % (byte_range[0], byte_range[1] - 1))
    with urllib.request.urlopen(req, timeout=60) as r:
        data, partial = r.read(), r.status == 206
    if byte_range and not partial:
        data = data[byte_range[0]:byte_range[1]]
    if want_hash and not byte_range and blake3.blake3(data).hexdigest() != want_hash.lower():
        raise ValueError("downloaded bytes do not match their hash")
    return data


def put(url, data):
    req = urllib.request.Request(url, data=data, method="PUT",
                                 headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


# --- the tensor wire format: b"IOTW", version, dtype, rank u16, dims u32, payload (LE) ---

def decode_tensor(data):
    if data[:4] != b"IOTW":
        raise ValueError("not a wire tensor")
    dtype, rank = data[5], struct.unpack_from("<H", data, 6)[0]
    shape = list(struct.unpack_from("<%dI" % rank, data, 8))
    n, off = math.prod(shape), 8 + 4 * rank
    if dtype == 0:
        return shape, array("f", data[off:off + 4 * n]).tolist()
    if dtype == 1:
        bits = array("H", data[off:off + 2 * n])
        return shape, array("f", array("I", (b << 16 for b in bits)).tobytes()).tolist()
    row = shape[-1] if shape else 1
    group = -(-256 // row) if row else 1
    blocks = -(-(n // max(row, 1)) // group)
    scales = array("f", data[off:off + 4 * blocks])
    q = struct.unpack_from("<%db" % n, data, off + 4 * blocks)
    per = group * row
    return shape, [v * scales[i // per] for i, v in enumerate(q)]


def encode_tensor(shape, values, dtype):
    head = b"IOTW" + bytes([2, DTYPES[dtype]]) + struct.pack("<H%dI" % len(shape), len(shape), *shape)
    if dtype == "f32":
        return head + array("f", values).tobytes()
    if dtype == "bf16":
        bits = array("I", array("f", values).tobytes())
        return head + array("H", (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF for b in bits)).tobytes()
    row = shape[-1] if shape else 1
    per = (-(-256 // row) if row else 1) * row
    scales, qs = array("f"), []
    for start in range(0, len(values), per):
        block = values[start:start + per]
        scale = max(abs(v) for v in block) / 127.0
        scales.append(scale)
        qs += [max(-127, min(127, int(math.copysign(math.floor(abs(v) / scale + 0.5), v)))) if scale else 0
               for v in block]
    return head + scales.tobytes() + struct.pack("<%db" % len(qs), *qs)


def moments(values):
    if not values:
        return 0.0, 1.0
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) or 1e-3


class Cheater:
    def __init__(self, args, api):
        self.args, self.api = args, api
        cheats = set(args.cheat.split(","))
        unknown = cheats - set(OUTPUTS) - set(BEHAVIOURS)
        if unknown:
            sys.exit("unknown cheat(s): %s" % ", ".join(sorted(unknown)))
        self.cheats = cheats
        self.output = next((c for c in OUTPUTS if c in cheats), "noise")
        self.held_epoch, self.held_hash, self.held_state = 0, None, None
        self.sent = []  # (sample, bytes) of earlier uploads, for `replayed`
        self.merged_epochs = set()

    # --- joining ---
    def register(self):
        a, api = self.args, self.api
        api.run = api.get("/api/run")["run"]
        while a.wait_miners and self.miner_count() < a.wait_miners:
            time.sleep(0.5)
        throwaways = 0
        if "steer" in self.cheats and a.section is not None:
            for i in range(a.max_throwaways):
                if self.next_section() == a.section:
                    break
                key = Keypair.create_from_uri(f"{a.key}/throwaway/{i}")
                status, resp = api.post("/api/register", {"device": "cpu", "max_in_flight": 1}, key)
                throwaways += 1
                emit("throwaway", hotkey=key.ss58_address, status=status, section=resp.get("section"))
        status, resp = self.register_key(api.key)
        # Grinding: a fresh key until one lands in the section wanted (each a registration). A
        # key goes to a section with the fewest proven miners, so while the wanted one has more
        # than another, every key misses it: wait a second between keys for that to change.
        ground = 0
        while ("steer" in self.cheats and a.section is not None and ground < a.grind
               and resp.get("section") != a.section):
            ground += 1
            time.sleep(1)
            api.key = Keypair.create_from_uri(f"{a.key}/grind/{ground}")
            if a.forwarded_for:
                api.forwarded_for = address(a.forwarded_for, ground)
            status, resp = self.register_key(api.key)
        self.section, self.settings = resp["section"], resp["settings"]
        n = len(resp["model"]["sections"])
        self.head, self.tail = self.section == 0, self.section == n - 1
        self.vocab = resp["model"].get("vocab_size", 256)
        cp = resp.get("checkpoint")
        if cp:
            self.adopt(cp)
        emit("registered", hotkey=self.api.key.ss58_address, section=self.section, sections=n,
             target=a.section, throwaways=throwaways, ground=ground, cheats=sorted(self.cheats), output=self.output,
             wire=self.settings["wire"])

    def miner_count(self, section=None):
        try:
            sections = self.api.get("/api/status")["sections"]
        except OSError:
            return 0
        return sum(len(s["miners"]) for s in sections if section is None or s["index"] == section)

    def register_key(self, key):
        """Registers `key`, retrying a refusal `--register-tries` times 2 s apart; exits 2."""
        for attempt in range(self.args.register_tries):
            status, resp = self.api.post("/api/register", {"device": "cpu (hostile)", "max_in_flight": 4}, key)
            if status == 200:
                return status, resp
            emit("register_refused", status=status, body=resp, attempt=attempt)
            time.sleep(2)
        sys.exit(2)

    def next_section(self):
        """The section a new key would get if the orchestrator fills the emptiest, lowest first."""
        sections = self.api.get("/api/status")["sections"]
        return min(sections, key=lambda s: (len(s["miners"]), s["index"]))["index"]

    # --- the training loop ---
    def serve(self, until):
        unreachable = False
        while time.time() < until:
            try:
                status, work = self.api.post("/api/work", {"max": self.settings["max_in_flight"],
                                                           "wait_ms": 2000})
            except OSError as e:
                if not unreachable:
                    emit("unreachable", reason=str(e))
                unreachable = True
                time.sleep(1)
                continue
            unreachable = False
            if status != 200:
                emit("work_refused", status=status, body=work)
                time.sleep(1)
                continue
            if work["phase"] != "training" or work["epoch"] > self.held_epoch:
                try:
                    self.merge_round(work["epoch"])
                except (OSError, ValueError) as e:
                    emit("merge_error", reason=str(e))
            for a in work["assignments"]:
                try:
                    self.answer(a, work["epoch"])
                except (OSError, ValueError) as e:
                    COUNTS["errors"] += 1
                    emit("error", assignment=a["id"], reason=str(e))
            if not work["assignments"] and work["phase"] != "training":
                time.sleep(0.5)

    def answer(self, a, epoch):
        kind, t0 = a["kind"], time.time()
        tokens_in = self.head and kind in ("forward", "eval")
        values = [] if tokens_in or (self.head and kind == "backward") else decode_tensor(
            fetch(a["input"]["url"], a["input"]["hash"]))[1]
        download_ms = int((time.time() - t0) * 1000)
        loss = None
        if self.tail and kind in ("forward", "eval"):
            loss = self.public_loss() if "fake-loss" in self.cheats else math.log(self.vocab)
        submit = {"assignment_id": a["id"], "output_hash": None, "output_bytes": None, "loss": loss,
                  "timings": {"download_ms": download_ms, "compute_ms": 40, "upload_ms": 0}}
        out = a.get("output")
        if out:
            data = self.fake_output(a["sample_id"], out["shape"], values)
            t1 = time.time()
            put(out["url"], data)
            submit.update(output_hash=blake3.blake3(data).hexdigest(), output_bytes=len(data))
            submit["timings"]["upload_ms"] = int((time.time() - t1) * 1000)
        status, resp = self.api.post("/api/submit", submit)
        accepted = status == 200 and resp.get("accepted")
        COUNTS["accepted" if accepted else "refused"] += 1
        if accepted and kind != "eval":
            COUNTS["forwards" if kind == "forward" else "backwards"] += 1
            if self.tail and kind == "forward":
                COUNTS["backwards"] += 1
        emit("submitted", kind=kind, sample=a["sample_id"], epoch=epoch, section=self.section,
             accepted=bool(accepted), loss=loss, reason=None if accepted else resp)

    def fake_output(self, sample, shape, values):
        wire, n = self.settings["wire"], math.prod(shape)
        if self.output == "replayed":
            earlier = [d for s, d in self.sent if s != sample]
            if earlier:
                return random.choice(earlier)
        if self.output == "zeros":
            out = [0.0] * n
        elif self.output == "scaled" and len(values) == n:
            out = [0.5 * v for v in values]
        else:
            mean, std = moments(values)
            out = [random.gauss(mean, std) for _ in range(n)]
        data = encode_tensor(shape, out, wire)
        self.sent = (self.sent + [(sample, data)])[-64:]
        return data

    def public_loss(self):
        loss = self.api.get("/api/status").get("recent_loss")
        return float(loss) if loss is not None else math.log(self.vocab)

    # --- merges ---
    def merge_round(self, epoch):
        if "silent-merge" in self.cheats:
            if epoch > self.held_epoch:
                emit("merge_skipped", epoch=epoch)
                self.held_epoch = epoch  # it says it holds the new weights; it never fetched them
            return
        while True:
            status, resp = self.api.post("/api/merge/task", {"held_epoch": self.held_epoch})
            if status != 200:
                emit("merge_refused", status=status, body=resp)
                return
            task = resp["task"]
            if task["kind"] == "train":
                return
            if task["kind"] == "adopt":
                self.adopt(task["checkpoint"])
            elif task["kind"] == "upload":
                self.upload(task)
            elif task["kind"] == "merge":
                self.merge(task)
            else:
                time.sleep(min(task.get("retry_ms", 500), 1000) / 1000)

    def upload(self, task):
        key = ("upload", task["epoch"])
        if key in self.merged_epochs:
            time.sleep(1)
            return
        self.merged_epochs.add(key)
        if "no-deliver" in self.cheats:
            emit("upload_leased_not_delivered", epoch=task["epoch"])
            return
        state = self.held_state
        if state is None or task["wire"] != "f32" or len(state) != 4 * task["target"]["shape"][0]:
            emit("upload_skipped", epoch=task["epoch"], reason="no state to copy")
            return
        # The merged state it was handed, its parameters jittered so that it does not look
        # exactly like the state it started from. It did not train.
        values = array("f", state)
        params = len(values) // 3
        for i in range(params):
            values[i] *= 1.0 + 1e-3 * random.gauss(0.0, 1.0)
        state = values.tobytes()
        put(task["target"]["url"], state)
        manifest = {"layout": task["layout"], "dtype": "f32",
                    "hash": blake3.blake3(state).hexdigest(), "bytes": len(state)}
        status, resp = self.api.post("/api/merge/submit", {"kind": "upload", "epoch": task["epoch"],
                                                           "manifest": manifest})
        emit("upload", epoch=task["epoch"], status=status, body=resp)

    def merge(self, task):
        for p in task["partitions"]:
            key = ("partition", task["epoch"], p["index"])
            if key in self.merged_epochs:
                continue
            self.merged_epochs.add(key)
            if "no-deliver" in self.cheats or task["wire"] != "f32" or task["op"] != "mean":
                emit("partition_not_delivered", epoch=task["epoch"], index=p["index"])
                continue
            rng = (4 * p["start"], 4 * p["end"])
            total = sum(s["weight"] for s in p["sources"]) or 1.0
            acc = [0.0] * (p["end"] - p["start"])
            for s in p["sources"]:
                vals = array("f", fetch(s["blob"]["url"], byte_range=rng))
                for i, v in enumerate(vals):
                    acc[i] += s["weight"] * v
            data = array("f", [v / total for v in acc]).tobytes()
            put(p["output"]["url"], data)
            status, resp = self.api.post("/api/merge/submit", {
                "kind": "partition", "epoch": task["epoch"], "index": p["index"],
                "hash": blake3.blake3(data).hexdigest(), "bytes": len(data)})
            emit("partition", epoch=task["epoch"], index=p["index"], status=status, body=resp)
        time.sleep(0.2)

    def adopt(self, cp):
        self.held_state = fetch(cp["blob"]["url"], cp["blob"].get("hash"))
        self.held_epoch, self.held_hash = cp["epoch"], cp["blob"].get("hash")
        emit("adopted", epoch=cp["epoch"])

    # --- heartbeats ---
    def heartbeats(self):
        while True:
            time.sleep(self.settings.get("heartbeat_s", 2))
            epoch, digest = self.held_epoch, self.held_hash
            if "honest-heartbeat-lie" in self.cheats:
                try:
                    merge = self.api.get("/api/merge/status")
                    mine = next(s for s in merge["sections"] if s["section"] == self.section)
                    epoch, digest = merge["epoch"], mine.get("checkpoint_hash") or digest
                except (OSError, StopIteration, KeyError):
                    pass
            body = {"forwards": COUNTS["forwards"], "backwards": COUNTS["backwards"],
                    "steps": COUNTS["backwards"], "weights_epoch": epoch, "weights_hash": digest,
                    "usage": None}
            try:
                self.api.post("/api/heartbeat", body)
            except OSError:
                pass


def address(first, n):
    """The IPv4 address `n` after `first`."""
    a = [int(x) for x in first.split(".")]
    v = ((a[0] << 24) | (a[1] << 16) | (a[2] << 8) | a[3]) + n
    return ".".join(str((v >> s) & 255) for s in (24, 16, 8, 0))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="orchestrator, e.g. http://127.0.0.1:8700")
    p.add_argument("--key", default="//Cheater", help="secret URI or mnemonic of the hotkey")
    p.add_argument("--cheat", default=DEFAULT_CHEAT)
    p.add_argument("--section", type=int, help="section to steer into (with steer)")
    p.add_argument("--max-throwaways", type=int, default=12)
    p.add_argument("--grind", type=int, default=0,
                   help="with steer: register up to N fresh keys, 1 s apart, until one lands in --section")
    p.add_argument("--register-tries", type=int, default=15, help="2 s apart")
    p.add_argument("--wait-miners", type=int, default=0, help="register once this many miners are")
    p.add_argument("--seconds", type=float, default=1e9)
    p.add_argument("--register-only", action="store_true")
    p.add_argument("--forwarded-for", help="send X-Forwarded-For from this IPv4 address (and, "
                   "grinding, from the next ones): an attacker with many addresses behind a proxy")
    p.add_argument("--flood", type=int, default=0,
                   help="register N fresh keys back to back (a flood or a grind), print each answer, exit")
    args = p.parse_args()
    key = (Keypair.create_from_mnemonic(args.key) if " " in args.key
           else Keypair.create_from_uri(args.key))

    def stop(*_):
        emit("stopped", **COUNTS)
        sys.stdout.flush()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    api = Api(args.url, key, args.forwarded_for and address(args.forwarded_for, 0))
    deadline = time.time() + 60
    while True:
        try:
            api.get("/api/run")
            break
        except OSError:
            if time.time() > deadline:
                sys.exit("the orchestrator does not answer at " + args.url)
            time.sleep(0.5)
    if args.flood:
        api.run = api.get("/api/run")["run"]
        for i in range(args.flood):
            fresh = Keypair.create_from_uri(f"{args.key}/flood/{i}")
            status, resp = api.post("/api/register", {"device": "cpu (hostile)", "max_in_flight": 1}, fresh)
            emit("flood", i=i, hotkey=fresh.ss58_address, status=status, section=resp.get("section"),
                 code=resp.get("code"), message=resp.get("message"), retry_after=api.retry_after)
        return
    cheater = Cheater(args, api)
    cheater.register()
    if args.register_only:
        return
    threading.Thread(target=cheater.heartbeats, daemon=True).start()
    cheater.serve(time.time() + args.seconds)
    emit("stopped", **COUNTS)


if __name__ == "__main__":
    main()
