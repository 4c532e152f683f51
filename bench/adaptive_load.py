#!/usr/bin/env python3
"""The upstream and the load of bench/adaptive.sh.

  adaptive_load.py upstream PORT --phases 20:10,6:10,20:10 [--call-ms 100]
      An HTTP/1.1 server with a pool of workers whose size follows the
      phases (workers:seconds, from the Unix time T of a `GET /start/T`;
      before T and after the last phase, the first phase's workers). Each call holds one worker for
      CALL_MS; a call that finds every worker busy waits in a FIFO queue, as
      in a thread-pool server. A queued call whose client has already gone
      (its connection closed) is skipped instead of served.

  adaptive_load.py load --phases ... --rate R --arm NAME=PORT ... --upstream PORT ...
      [--warm S --warm-rate R0] [--timeout-ms 1000] --out FILE
      An open-loop generator: tells each upstream the phases start at T (S + 0.5
      seconds from now, or the time in --start-file), then from T - S to T at R0 calls/s (unloaded), then
      R calls/s over the phases, the same schedule for every arm (call i of
      each arm at the same instant), each call on a free keep-alive
      connection or a new one. The latency of a call is measured from its
      scheduled time; a call without an answer within TIMEOUT_MS is counted
      as a timeout (its connection closed). One line per call in FILE:
      arm, seconds since T (scheduled), status (0: timeout, -1: error),
      latency in ms.

  adaptive_load.py report FILE... --phases ... --timeout-ms 1000
      Per arm and phase: goodput (2xx/s), p50/p99 of the admitted calls (the
      calls the agent forwarded: every call but a 408, timeouts counted at
      the timeout), rejections/s; rejections per second around each phase
      change; the ratios the targets speak of. With several files (runs),
      every run's ratios and their medians.
"""
import argparse
import asyncio
import collections
import statistics
import sys
import time


def phases_of(text):
    out = []
    for part in text.split(","):
        workers, secs = part.split(":")
        out.append((int(workers), float(secs)))
    return out


# --- upstream ---------------------------------------------------------------


class Pool:
    """Workers whose number follows the phases; a FIFO queue in front."""

    def __init__(self, phases):
        self.start, self.phases = float("inf"), phases
        self.busy = 0
        self.queue = collections.deque()

    def workers(self):
        t = time.time() - self.start
        if t < 0:
            return self.phases[0][0]
        for workers, secs in self.phases:
            if t < secs:
                return workers
            t -= secs
        return self.phases[0][0]

    def pump(self):
        cap = self.workers()
        while self.busy < cap and self.queue:
            fut, gone = self.queue.popleft()
            if fut.done():
                continue
            if gone():
                fut.set_result(False)
                continue
            self.busy += 1
            fut.set_result(True)

    async def ticker(self):
        # The pool grows at a phase change without waiting for a call to end.
        while True:
            await asyncio.sleep(0.005)
            self.pump()


async def upstream(args):
    pool = Pool(phases_of(args.phases))
    call = args.call_ms / 1000.0
    body = b"ok\n"
    head_ok = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n"

    async def serve(reader, writer):
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    return
                if head.startswith(b"GET /start/"):
                    pool.start = float(head.split()[1].split(b"/")[2])
                    writer.write(head_ok + body)
                    await writer.drain()
                    continue
                fut = asyncio.get_running_loop().create_future()
                pool.queue.append((fut, reader.at_eof))
                pool.pump()
                if not await fut:
                    return
                try:
                    await asyncio.sleep(call)
                finally:
                    pool.busy -= 1
                    pool.pump()
                writer.write(head_ok + body)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", args.port, backlog=4096)
    asyncio.ensure_future(pool.ticker())
    async with server:
        await server.serve_forever()


# --- load -------------------------------------------------------------------


class Arm:
    def __init__(self, name, port):
        self.name, self.port = name, port
        self.idle = []

    async def call(self):
        conn = self.idle.pop() if self.idle else None
        if conn is None:
            conn = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = conn
        try:
            writer.write(b"GET /work HTTP/1.1\r\nhost: bench\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            status = int(lines[0].split()[1])
            length, close = 0, False
            for line in lines[1:]:
                k, _, v = line.partition(b":")
                k = k.strip().lower()
                if k == b"content-length":
                    length = int(v)
                elif k == b"connection" and v.strip().lower() == b"close":
                    close = True
            if length:
                await reader.readexactly(length)
        except BaseException:
            # A timeout or a broken connection: it is not reused.
            writer.close()
            raise
        if close:
            writer.close()
        else:
            self.idle.append(conn)
        return status


async def load(args):
    phases = phases_of(args.phases)
    arms = []
    for spec in args.arm:
        name, port = spec.split("=")
        arms.append(Arm(name, int(port)))
    out = open(args.out, "w")
    # Several generators (one per arm) share the start a file holds.
    args.start = float(open(args.start_file).read()) if args.start_file else time.time() + args.warm + 0.5
    for port in args.upstream:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET /start/{args.start} HTTP/1.1\r\nhost: bench\r\n\r\n".encode())
        await reader.readuntil(b"\r\n\r\n")
        writer.close()
    if not args.start_file:
        with open(args.out + ".start", "w") as f:
            f.write(f"{args.start}\n")
    timeout = args.timeout_ms / 1000.0
    total = sum(s for _, s in phases)
    tasks = set()

    async def one(arm, sched):
        loop_t0 = time.time()
        status = -1
        deadline = sched + timeout
        try:
            async with asyncio.timeout(max(deadline - loop_t0, 0.001)):
                status = await arm.call()
        except TimeoutError:
            status = 0
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError):
            status = -1
        latency = (time.time() - sched) * 1000.0
        if status > 0 and latency > args.timeout_ms:
            status = 0
        if not out.closed:
            out.write(f"{arm.name}\t{sched - args.start:.4f}\t{status}\t{latency:.2f}\n")

    def schedule(t_from, t_to, rate):
        n = int(round((t_to - t_from) * rate))
        return [t_from + i / rate for i in range(n)]

    plan = []
    if args.warm > 0:
        plan += schedule(args.start - args.warm, args.start, args.warm_rate)
    plan += schedule(args.start, args.start + total, args.rate)
    i = 0
    rotate = 0
    while i < len(plan):
        now = time.time()
        while i < len(plan) and plan[i] <= now:
            sched = plan[i]
            # The arms in a rotating order: none is always served first.
            for k in range(len(arms)):
                arm = arms[(k + rotate) % len(arms)]
                t = asyncio.ensure_future(one(arm, sched))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            rotate += 1
            i += 1
        if i < len(plan):
            await asyncio.sleep(max(0.0, min(plan[i] - time.time(), 0.002)))
    await asyncio.sleep(timeout + 0.2)
    for t in list(tasks):
        t.cancel()
    out.close()


# --- report -----------------------------------------------------------------


SETTLE = 2.0


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, int(round(p / 100.0 * len(values) + 0.5)) - 1))
    return values[k]


def analyse(path, phases, timeout_ms, reject):
    rows = collections.defaultdict(list)
    for line in open(path):
        arm, t, status, latency = line.split("\t")
        rows[arm].append((float(t), int(status), float(latency)))
    edges = []
    at = 0.0
    for workers, secs in phases:
        edges.append((at, at + secs, workers))
        at += secs
    res = {}
    for arm, calls in rows.items():
        unloaded = [lat for t, s, lat in calls if t < 0 and 200 <= s < 300]
        r = {"unloaded_p99": pct(unloaded, 99), "phases": [], "per_second": collections.Counter(), "ok_per_second": collections.Counter()}
        for t, s, lat in calls:
            if t >= 0 and s == reject:
                r["per_second"][int(t // 1)] += 1
            if t >= 0 and 200 <= s < 300:
                r["ok_per_second"][int(t // 1)] += 1
        for lo, hi, workers in edges:
            sel = [(s, lat) for t, s, lat in calls if lo <= t < hi]
            ok = sum(1 for s, _ in sel if 200 <= s < 300)
            rej = sum(1 for s, _ in sel if s == reject)
            timeouts = sum(1 for s, _ in sel if s == 0)
            errors = sum(1 for s, _ in sel if s < 0 or (s >= 300 and s != reject))
            admitted = [min(lat, timeout_ms) if s == 0 else lat for s, lat in sel if s != reject and s != -1]
            # From SETTLE seconds after the phase began: the calls admitted
            # before the change was measured left out.
            settled = [min(lat, timeout_ms) if s == 0 else lat for t, s, lat in calls
                       if lo + SETTLE <= t < hi and s != reject and s != -1]
            r["phases"].append({
                "workers": workers, "secs": hi - lo, "goodput": ok / (hi - lo),
                "p50": pct(admitted, 50), "p99": pct(admitted, 99), "p99_settled": pct(settled, 99),
                "rejected_per_s": rej / (hi - lo), "timeouts": timeouts, "errors": errors,
            })
        res[arm] = r
    return res, edges


def report(args):
    phases = phases_of(args.phases)
    runs = [analyse(p, phases, args.timeout_ms, args.reject) for p in args.files]
    ratios = collections.defaultdict(list)
    for n, (res, edges) in enumerate(runs, 1):
        print(f"run {n} ({args.files[n - 1]})")
        print(f"  arm        phase  workers  goodput/s  admitted p50 ms  p99 ms  p99 from {SETTLE:.0f}s  rejected/s  timeouts  errors")
        for arm, r in sorted(res.items()):
            for k, ph in enumerate(r["phases"], 1):
                print(f"  {arm:10} {k:5}  {ph['workers']:7}  {ph['goodput']:9.1f}  {ph['p50']:15.1f}  {ph['p99']:6.1f}"
                      f"  {ph['p99_settled']:11.1f}  {ph['rejected_per_s']:10.1f}  {ph['timeouts']:8}  {ph['errors']:6}")
            print(f"  {arm:10} unloaded p99 {r['unloaded_p99']:.1f} ms")
        print("  rejections per second around each phase change (s relative to the change):")
        for lo, _, workers in edges[1:]:
            c = int(lo)
            secs = list(range(c - 2, c + 4))
            print(f"    at {c}s (-> {workers} workers): " + "  ".join(
                f"{arm} [" + " ".join(str(res[arm]['per_second'][s]) for s in secs) + "]" for arm in sorted(res)))
        if "fixed" in res and "adaptive" in res:
            unloaded = res["adaptive"]["unloaded_p99"]
            for k, (f, a) in enumerate(zip(res["fixed"]["phases"], res["adaptive"]["phases"]), 1):
                ratios[f"goodput adaptive/fixed, phase {k}"].append(a["goodput"] / max(f["goodput"], 1e-9))
                ratios[f"admitted p99 adaptive/unloaded, phase {k}"].append(a["p99"] / unloaded)
                ratios[f"admitted p99 from {SETTLE:.0f}s adaptive/unloaded, phase {k}"].append(a["p99_settled"] / unloaded)
                ratios[f"admitted p99 fixed/unloaded, phase {k}"].append(f["p99"] / res["fixed"]["unloaded_p99"])
            if "none" in res:
                for k, (nb, a) in enumerate(zip(res["none"]["phases"], res["adaptive"]["phases"]), 1):
                    ratios[f"goodput none/fixed, phase {k}"].append(nb["goodput"] / max(res["fixed"]["phases"][k - 1]["goodput"], 1e-9))
            # The worst second after each change: the fewest 2xx in the 4 s after it (adaptive / fixed).
            for lo, _, workers in edges[1:]:
                c = int(lo)
                worst = min(res["adaptive"]["ok_per_second"][s] / max(res["fixed"]["ok_per_second"][s], 1) for s in range(c + 1, c + 4))
                ratios[f"worst second 1-4 s after the change to {workers} workers, 2xx adaptive/fixed"].append(worst)
        print()
    if ratios:
        print(f"ratios, median of {len(runs)} run(s) (per run):")
        for k, v in ratios.items():
            print(f"  {k}: {statistics.median(v):.2f} ({', '.join(f'{x:.2f}' for x in v)})")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("upstream")
    u.add_argument("port", type=int)
    u.add_argument("--phases", required=True)
    u.add_argument("--call-ms", type=float, default=100.0)
    lo = sub.add_parser("load")
    lo.add_argument("--upstream", type=int, action="append", default=[])
    lo.add_argument("--start-file")
    lo.add_argument("--phases", required=True)
    lo.add_argument("--rate", type=float, required=True)
    lo.add_argument("--arm", action="append", required=True)
    lo.add_argument("--warm", type=float, default=0.0)
    lo.add_argument("--warm-rate", type=float, default=20.0)
    lo.add_argument("--timeout-ms", type=float, default=1000.0)
    lo.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("files", nargs="+")
    r.add_argument("--phases", required=True)
    r.add_argument("--timeout-ms", type=float, default=1000.0)
    r.add_argument("--reject", type=int, default=408)
    args = p.parse_args()
    if args.cmd == "upstream":
        asyncio.run(upstream(args))
    elif args.cmd == "load":
        asyncio.run(load(args))
    else:
        report(args)


if __name__ == "__main__":
    sys.exit(main())
