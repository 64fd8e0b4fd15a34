#!/usr/bin/env node
// The board of the 32-bit heap leg (tests/gateway/test_heap_ci_wasm32.py): the deployed gateway
// (tools/deploy.py's .mpy files, main.py's run.main, config.py) in the npm WebAssembly
// MicroPython (1.27, 32-bit), in a heap of exactly the board's size, on the thin fakes of
// tests/core/mp_fakes.py (tests/mp/board_rig.py). The world - the companion's LinkSession and the
// two clients - is the test's CPython process, at the other end of stdin/stdout.
//
//   node tests/mp/board_heap.mjs '{"heap": 131072, "board": DIR, "rig": DIR, "argv": [...]}'
//
// DIR "board" is the deployed layout (and link.key), copied to /board (the working directory);
// DIR "rig" holds board_rig.py, mp_fakes.py and what mp_fakes imports, copied to /rig.
//
// The heap. This build (MICROPY_GC_SPLIT_HEAP_AUTO) grows its heap from the C heap whenever an
// allocation does not fit, up to 128 MiB: `heapsize` alone is only where it starts. So after
// loading, the C heap is used up here (blocks malloc'd until none fits, a few 16 KiB holes freed
// again for the interpreter's own small mallocs): a growth asks for at least the heap's size and
// fails, and an allocation that does not fit raises MemoryError as on a board. The instance's
// heap is the board heap plus room for the rig; the rig (board_rig.py, the fakes, their copy of
// the core) is allocated first, then a ballast leaves exactly as many bytes free as a fresh
// instance with heapsize = the board heap has (measured here first, in an instance of its own).
// Every figure reported is collected (taken at the start of a call, after the collection this
// build runs when a call returns) and has the 128 MiB reserve gc.mem_free() adds taken off.
//
// Then the phases of board_rig.py, one call each (this build collects only between calls): boot
// (gateway.boot + run.main's unloads), start (run.main itself: the memory line), and then, per
// command from stdin, step (the world's bytes in, dt ms, one GatewayLoop.step, the gateway's
// bytes out) or stop (GatewayLoop.run's shut-down: heap at stop, counters).
//
// Protocol (binary, both ways): [u32 length LE][payload]. First reply: a JSON report of the
// set-up. Commands: "S" u16 dt, u16 n, records -> the gateway's records; "H" -> JSON heap figures;
// "T" -> JSON of stop(); "Q" -> exit. A record: u8 kind (0 datagram, 1 TCP bytes of client idx,
// 2 client idx connects), u8 idx, u16 length, bytes. An error: a JSON reply {"error": ...}.
// MicroPython's output (the gateway's log) goes to stderr.

import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const PKG = "@micropython/micropython-webassembly-pyscript";
const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, "..", "..");
const ROOM = 512 * 1024; // the rig's share of the instance heap (its peak, compiling included)
const HOLE = 16 * 1024; // the C heap's holes left for the interpreter's own mallocs
const HOLES = 16;

const cfg = JSON.parse(process.argv[2] || "{}");
const { loadMicroPython } = await import(path.join(ROOT, "node_modules", PKG, "micropython.mjs"));

function log(s) {
  process.stderr.write(s + "\n");
}

function reply(buf) {
  const head = Buffer.alloc(4);
  head.writeUInt32LE(buf.length, 0);
  writeAll(head);
  writeAll(buf);
}

function writeAll(buf) {
  let o = 0;
  while (o < buf.length) o += fs.writeSync(1, buf, o, buf.length - o);
}

function readExactly(n) {
  const buf = Buffer.alloc(n);
  let o = 0;
  while (o < n) {
    let k;
    try {
      k = fs.readSync(0, buf, o, n - o, null);
    } catch (e) {
      if (e.code === "EAGAIN") continue;
      throw e;
    }
    if (k === 0) return null;
    o += k;
  }
  return buf;
}

// The instance's memory: this build exports getValue/setValue, not its HEAPU8 view.
function poke(M, addr, buf) {
  let i = 0;
  for (; i + 4 <= buf.length; i += 4) M.setValue(addr + i, buf.readInt32LE(i), "i32");
  for (; i < buf.length; i++) M.setValue(addr + i, buf[i], "i8");
}

function peek(M, addr, n) {
  const buf = Buffer.alloc(n);
  let i = 0;
  for (; i + 4 <= n; i += 4) buf.writeInt32LE(M.getValue(addr + i, "i32"), i);
  for (; i < n; i++) buf[i] = M.getValue(addr + i, "i8") & 255;
  return buf;
}

function json(obj) {
  reply(Buffer.from(JSON.stringify(obj)));
}

function copyTree(FS, src, dst) {
  try {
    FS.mkdir(dst);
  } catch {
    // exists
  }
  for (const f of fs.readdirSync(src).sort()) {
    const p = path.join(src, f);
    if (fs.statSync(p).isDirectory()) copyTree(FS, p, dst + "/" + f);
    else FS.writeFile(dst + "/" + f, fs.readFileSync(p));
  }
}

// Use up the C heap: no heap growth from here on (see the top). Emscripten's complaint about the
// memory it cannot grow is what a refused growth looks like: said once here, in our words.
function capHeap(M) {
  const write = process.stderr.write.bind(process.stderr);
  let capped = false;
  process.stderr.write = (s, ...a) => {
    if (!String(s).startsWith("Cannot enlarge memory")) return write(s, ...a);
    if (capped) write("board_heap: the heap did not grow (the C heap is used up)\n");
    return true;
  };
  const holes = [];
  for (let i = 0; i < HOLES; i++) {
    holes.push(M._malloc(HOLE));
    M._malloc(64); // keeps the holes apart
  }
  let size = 1 << 30;
  let used = 0;
  while (size >= 16) {
    if (M._malloc(size)) used += size;
    else size >>= 1;
  }
  for (const h of holes) M._free(h);
  capped = true;
  return used;
}

// A fresh instance with heapsize = the board heap: what is free there before main.py runs.
async function reference(heap) {
  const mp = await loadMicroPython({ heapsize: heap, stdout: log, stderr: log });
  mp.runPython("import gc\ngc.collect()\ndef _h(k):\n    return gc.mem_free() - 134217728 if k " +
    "else gc.mem_alloc()");
  const h = mp.globals.get("_h");
  const free = h(1);
  const alloc = h(0);
  return { free, alloc, total: free + alloc };
}

function pyError(e) {
  return { error: e && e.type ? e.type : "Error", message: String(e && e.message ? e.message : e) };
}

async function main() {
  const ref = await reference(cfg.heap);
  const mp = await loadMicroPython({ heapsize: cfg.heap + ROOM, stdout: log, stderr: log });
  const M = mp._module;
  copyTree(mp.FS, cfg.board, "/board");
  copyTree(mp.FS, cfg.rig, "/rig");
  const capped = capHeap(M);
  const report = { heap: cfg.heap, reference: ref, c_heap_capped: capped };
  let rig;
  try {
    mp.runPython("import os, sys\nos.chdir('/board')\nsys.path[:0] = ['/board', '/rig']\n" +
      "import board_rig");
    const mod = mp.pyimport("board_rig");
    // every function looked up once, now: each lookup from JavaScript makes a proxy entry in
    // the Python heap; calls with ints allocate nothing there
    rig = {};
    for (const f of ["address", "heap", "set_argv", "forget_modules", "fill", "boot", "start",
      "step", "stop"]) rig[f] = mod[f];
  } catch (e) {
    json({ ...report, phase: "rig", ...pyError(e) });
    return;
  }
  const inbox = rig.address(0);
  const outbox = rig.address(1);
  const argvBytes = Buffer.from(cfg.argv.join("\0") + "\0", "ascii");
  poke(M, inbox, argvBytes);
  rig.set_argv(cfg.argv.length);
  rig.forget_modules();
  report.rig = { alloc: rig.heap(1), free: rig.heap(0), total: rig.heap(2) };
  report.ballast = rig.fill(ref.free);
  report.before = { free: rig.heap(0), alloc: rig.heap(1), total: rig.heap(2) };
  if (report.ballast < 0 || Math.abs(report.before.free - ref.free) > 16) {
    json({ ...report, phase: "ballast", error: "Rig", message: "could not match the free heap" });
    return;
  }
  const phase = (name, fn) => {
    try {
      return fn();
    } catch (e) {
      json({ ...report, phase: name, ...pyError(e) });
      return null;
    }
  };
  const booted = phase("boot", () => rig.boot());
  if (booted === null) return;
  report.boot = booted;
  report.after_boot = { free: rig.heap(0), total: rig.heap(2) };
  if (booted === -1) {
    const started = phase("start", () => rig.start());
    if (started === null) return;
    report.start = started;
  }
  report.after_start = { free: rig.heap(0), alloc: rig.heap(1), total: rig.heap(2) };
  json(report);

  for (;;) {
    const head = readExactly(4);
    if (head === null) return;
    const cmd = readExactly(head.readUInt32LE(0));
    if (cmd === null) return;
    const op = String.fromCharCode(cmd[0]);
    if (op === "Q") return;
    if (op === "H") {
      json({ free: rig.heap(0), alloc: rig.heap(1), total: rig.heap(2) });
    } else if (op === "T") {
      const status = phase("stop", () => rig.stop());
      if (status === null) return;
      json({ status, free: rig.heap(0), total: rig.heap(2) });
    } else if (op === "S") {
      const dt = cmd.readUInt16LE(1);
      const n = cmd.readUInt16LE(3);
      poke(M, inbox, cmd.subarray(5));
      const r = phase("step", () => rig.step(dt, n));
      if (r === null) return;
      if (r < 0) {
        json({ phase: "step", error: "Rig", message: "the fakes' buffers overflowed" });
        return;
      }
      reply(peek(M, outbox, r));
    } else {
      json({ error: "Usage", message: "unknown command " + op });
      return;
    }
  }
}

await main();
