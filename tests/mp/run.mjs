#!/usr/bin/env node
// Run the sans-IO core's tests (tests/core/test_*.py) under real MicroPython: the WebAssembly
// build from npm (@micropython/micropython-webassembly-pyscript, MicroPython 1.27), in Node.
//
//   node tests/mp/run.mjs                                   # every tests/core/test_*.py
//   node tests/mp/run.mjs tests/core/test_codec.py          # one file
//   node tests/mp/run.mjs tests/core/test_codec.py::test_crc  # one test
//
// Each test file gets a fresh MicroPython instance (in its own worker thread, so one module's heap
// state cannot disturb another's gc.mem_alloc() measurements, and a hung file can be stopped).
// ubrb_min.py (with any other top-level *.py), every tests/core/*.py and the shared test helpers
// (tests/__init__.py, tests/support/*.py) are copied into the instance's file system under /repo,
// mirroring the repository layout, and /repo and /repo/tests/core are appended to sys.path, so
// `import ubrb_min`, `import scripted` (a helper in tests/core) and
// `from tests.support.qos import QOS_R` work as under pytest.
//
// In a test module, every module-level callable named test_* runs, in definition order (then any
// others alphabetically). A module-level set CPYTHON_ONLY = {"test_x", ...} skips those here;
// MICROPYTHON_ONLY is honoured by tests/conftest.py on the pytest side. Output: one
// `PASS <file>::<test>` / `FAIL <file>::<test>` (+ traceback) / `SKIP ...` line per test, then a
// last line `N passed, N failed` (`, N skipped` if any). Exit status 0 only if at least one test
// passed and none failed.
//
// Environment: MP_FILE_TIMEOUT (seconds per test file, default 300); MP_HEAPSIZE (initial
// MicroPython heap in bytes, default 1 MiB; no cap: this build grows its heap on demand, to some
// 128 MiB), MP_PYSTACK (Python stack, default 2048), MP_JOBS (files run at once, default one per
// CPU; each file's output is printed together when it ends).

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Worker, isMainThread, parentPort, workerData } from "node:worker_threads";

const PKG = "@micropython/micropython-webassembly-pyscript";
const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, "..", "..");
const CORE_DIR = path.join(ROOT, "tests", "core");
const SUPPORT_DIR = path.join(ROOT, "tests", "support");
const CORE_MODULE = path.join(ROOT, "ubrb_min.py");
const FS_ROOT = "/repo";

// Runs inside MicroPython, once per test file. Reads its settings from the global _ubrb_cfg (JSON)
// and leaves "passed,failed,skipped" in the global _ubrb_counts.
const DRIVER = String.raw`
def _ubrb_main(cfg):
    import sys, gc
    for p in cfg["path"]:
        if p not in sys.path:
            sys.path.append(p)
    label = cfg["label"]
    try:
        mod = __import__(cfg["module"])
    except BaseException as e:
        print("FAIL", label, "(import)")
        sys.print_exception(e)
        return "0,1,0"
    names = []
    for n in cfg["order"]:
        if n not in names and callable(getattr(mod, n, None)):
            names.append(n)
    for n in sorted(dir(mod)):
        if n.startswith("test_") and n not in names and callable(getattr(mod, n, None)):
            names.append(n)
    npass = nfail = nskip = 0
    cp_only = getattr(mod, "CPYTHON_ONLY", ())
    mp_only = getattr(mod, "MICROPYTHON_ONLY", ())
    for set_name, members in (("CPYTHON_ONLY", cp_only), ("MICROPYTHON_ONLY", mp_only)):
        for n in members:
            if n not in names:
                print("FAIL", label + "::" + set_name, "names no test function:", repr(n))
                nfail += 1
    select = cfg["select"]
    for n in select:
        if n not in names:
            print("FAIL", label + "::" + n, "(no such test)")
            nfail += 1
    for n in names:
        if select and n not in select:
            continue
        if n in cp_only:
            print("SKIP", label + "::" + n, "(CPython-only)")
            nskip += 1
            continue
        fn = getattr(mod, n)
        gc.enable()
        gc.collect()
        try:
            fn()
        except BaseException as e:
            gc.enable()
            print("FAIL", label + "::" + n)
            sys.print_exception(e)
            nfail += 1
        else:
            gc.enable()
            print("PASS", label + "::" + n)
            npass += 1
    return "%d,%d,%d" % (npass, nfail, nskip)

import json as _json
_ubrb_counts = _ubrb_main(_json.loads(_ubrb_cfg))
`;

if (isMainThread) {
  process.exitCode = await main(process.argv.slice(2));
} else {
  await worker(workerData);
}

function usage() {
  return "usage: node tests/mp/run.mjs [tests/core/test_x.py[::test_name] ...]";
}

async function main(args) {
  if (args.includes("-h") || args.includes("--help")) {
    console.log(usage());
    return 0;
  }
  if (!fs.existsSync(CORE_MODULE)) {
    console.error(`run.mjs: ${CORE_MODULE} does not exist: nothing to test under MicroPython`);
    return 2;
  }
  try {
    await import(PKG);
  } catch (e) {
    console.error(`run.mjs: cannot load ${PKG} (${e.code || e.message}).`);
    console.error("run.mjs: install it with `make node_modules` (npm ci) at the repository root.");
    return 2;
  }

  // Which files and tests to run: a map file -> list of selected test names (empty: all).
  const plan = new Map();
  if (args.length === 0) {
    const found = fs.existsSync(CORE_DIR)
      ? fs.readdirSync(CORE_DIR).filter((f) => /^test_.*\.py$/.test(f)).sort()
      : [];
    for (const f of found) plan.set(path.join(CORE_DIR, f), []);
  }
  for (const arg of args) {
    if (arg.startsWith("-")) {
      console.error(`run.mjs: unknown option ${arg}\n${usage()}`);
      return 2;
    }
    const [file, name] = arg.split("::");
    const abs = path.resolve(file);
    if (!fs.existsSync(abs) || !abs.endsWith(".py")) {
      console.error(`run.mjs: no such test file: ${file}`);
      return 2;
    }
    if (!plan.has(abs)) plan.set(abs, []);
    if (name) plan.get(abs).push(name);
  }
  if (plan.size === 0) {
    console.error(`run.mjs: no test files (looked for ${path.relative(ROOT, CORE_DIR)}/test_*.py)`);
    console.log("0 passed, 0 failed");
    return 1;
  }

  // The files every instance gets: the top-level modules (ubrb_min.py and any other *.py at the
  // repository root), all of tests/core (test modules and helpers) and the shared test helpers
  // (the package tests.support; tests/core imports only its MicroPython-compatible modules).
  // The core, the MicroPython port (ports/__init__.py + ports/micropython/), the companion's link
  // end and the dual-runtime tests with their helpers.
  const common = [
    ...pyFiles(ROOT),
    ...pyFiles(path.join(ROOT, "ports")),
    ...pyFiles(path.join(ROOT, "ports", "micropython")),
    // the companion's link end, opposite the port in tests/core/mp_fakes.py
    ...["__init__.py", "errors.py", "link_end.py", "link_throttle.py"].map((f) => path.join(ROOT, "ros_side", f)),
    ...pyFiles(CORE_DIR),
    path.join(ROOT, "tests", "__init__.py"),
    ...pyFiles(SUPPORT_DIR),
  ];

  const timeoutS = Number(process.env.MP_FILE_TIMEOUT || 300);
  const jobs = Math.max(1, Number(process.env.MP_JOBS || os.availableParallelism()));
  const total = { passed: 0, failed: 0, skipped: 0 };
  const runOne = async ([file, select]) => {
    const rel = path.relative(ROOT, file);
    const files = {};
    const dirs = new Set([FS_ROOT]);
    for (const p of new Set([...common, file])) {
      const fsPath = toFsPath(p);
      files[fsPath] = fs.readFileSync(p, "utf8");
      dirs.add(path.posix.dirname(fsPath));
    }
    const source = files[toFsPath(file)];
    const order = [...source.matchAll(/^def\s+(test_\w+)\s*\(/gm)].map((m) => m[1]);
    const cfg = {
      label: rel,
      module: path.basename(file, ".py"),
      path: [...dirs],
      order,
      select,
    };
    const t0 = Date.now();
    const lines = [];
    const r = await runFile(files, cfg, timeoutS, lines);
    const dt = ((Date.now() - t0) / 1000).toFixed(1);
    // one file's lines together, whatever else ran beside it
    for (const [stream, s] of lines) (stream === "err" ? console.error : console.log)(s);
    console.log(`# ${rel} - ${r.passed} passed, ${r.failed} failed, ${r.skipped} skipped in ${dt} s`);
    total.passed += r.passed;
    total.failed += r.failed;
    total.skipped += r.skipped;
  };
  // files run side by side, each in its own instance (its heap figures are its own either way)
  const queue = [...plan];
  await Promise.all(Array.from({ length: Math.min(jobs, queue.length) }, async () => {
    while (queue.length) await runOne(queue.shift());
  }));

  if (total.passed === 0 && total.failed === 0) {
    console.error("run.mjs: no test ran");
  }
  let summary = `${total.passed} passed, ${total.failed} failed`;
  if (total.skipped) summary += `, ${total.skipped} skipped`;
  console.log(summary);
  return total.failed === 0 && total.passed > 0 ? 0 : 1;
}

function pyFiles(dir) {
  if (!fs.existsSync(dir)) return [];
  return fs
    .readdirSync(dir)
    .sort()
    .map((f) => path.join(dir, f))
    .filter((p) => p.endsWith(".py") && fs.statSync(p).isFile());
}

function toFsPath(p) {
  const rel = path.relative(ROOT, p);
  if (rel.startsWith("..") || path.isAbsolute(rel)) {
    return path.posix.join(FS_ROOT, "_outside", path.basename(p));
  }
  return path.posix.join(FS_ROOT, ...rel.split(path.sep));
}

function runFile(files, cfg, timeoutS, lines) {
  return new Promise((resolve) => {
    const w = new Worker(new URL(import.meta.url), {
      workerData: { files, cfg },
      stdout: false,
      stderr: false,
    });
    let result = null;
    let settled = false;
    const finish = (r) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(r);
    };
    const timer = setTimeout(() => {
      lines.push(["out", `FAIL ${cfg.label} (timed out after ${timeoutS} s; MP_FILE_TIMEOUT to change)`]);
      w.terminate();
      finish({ passed: 0, failed: 1, skipped: 0 });
    }, timeoutS * 1000);
    w.on("message", (m) => {
      if (m.t === "out" || m.t === "err") lines.push([m.t, m.s]);
      else if (m.t === "done") result = m.counts;
    });
    w.on("error", (e) => {
      lines.push(["out", `FAIL ${cfg.label} (MicroPython instance crashed: ${e && e.stack ? e.stack : e})`]);
      finish({ passed: 0, failed: 1, skipped: 0 });
    });
    w.on("exit", (code) => {
      if (settled) return;
      if (result) {
        const [passed, failed, skipped] = result.split(",").map(Number);
        finish({ passed, failed, skipped });
      } else {
        lines.push(["out", `FAIL ${cfg.label} (worker exited with code ${code} before reporting)`]);
        finish({ passed: 0, failed: 1, skipped: 0 });
      }
    });
  });
}

async function worker({ files, cfg }) {
  const out = (s) => parentPort.postMessage({ t: "out", s });
  const err = (s) => parentPort.postMessage({ t: "err", s });
  const { loadMicroPython } = await import(PKG);
  const opts = { stdout: out, stderr: err };
  if (process.env.MP_HEAPSIZE) opts.heapsize = Number(process.env.MP_HEAPSIZE);
  if (process.env.MP_PYSTACK) opts.pystack = Number(process.env.MP_PYSTACK);
  const mp = await loadMicroPython(opts);
  for (const [fsPath, text] of Object.entries(files)) {
    mkdirs(mp.FS, path.posix.dirname(fsPath));
    mp.FS.writeFile(fsPath, text);
  }
  mp.globals.set("_ubrb_cfg", JSON.stringify(cfg));
  try {
    mp.runPython(DRIVER);
    parentPort.postMessage({ t: "done", counts: String(mp.globals.get("_ubrb_counts")) });
  } catch (e) {
    out(`FAIL ${cfg.label} (test driver error)`);
    out(String(e && e.message ? e.message : e));
    parentPort.postMessage({ t: "done", counts: "0,1,0" });
  }
}

function mkdirs(FS, dir) {
  let cur = "";
  for (const part of dir.split("/").filter(Boolean)) {
    cur += "/" + part;
    try {
      FS.mkdir(cur);
    } catch {
      // exists
    }
  }
}
