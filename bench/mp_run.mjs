#!/usr/bin/env node
// Run one Python script of bench/ under real MicroPython 1.27 (the WebAssembly build from npm,
// as tests/mp/run.mjs does for tests): the core's modules and the script are copied into the instance's
// file system at /repo, which is also its working directory.
//
//   node bench/mp_run.mjs bench/link_auth.py
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const script = process.argv[2];
if (!script) {
  console.error("usage: node bench/mp_run.mjs bench/SCRIPT.py");
  process.exit(2);
}
const { loadMicroPython } = await import("@micropython/micropython-webassembly-pyscript");
const mp = await loadMicroPython({
  stdout: (s) => process.stdout.write(s.endsWith("\n") ? s : s + "\n"),
  stderr: (s) => process.stderr.write(s.endsWith("\n") ? s : s + "\n"),
  heapsize: Number(process.env.MP_HEAPSIZE || 4 * 1024 * 1024),
});
mp.FS.mkdir("/repo");
// the core and the modules beside it that start-up and the optional features load
for (const name of ["ubrb_min.py", "ubrb_setup.py", "ubrb_policy.py", "ubrb_keyed.py", "ubrb_stream.py", "ubrb_hold.py"]) {
  mp.FS.writeFile("/repo/" + name, fs.readFileSync(path.join(ROOT, name), "utf8"));
}
mp.FS.chdir("/repo");
mp.runPython("import os, sys\nos.chdir('/repo')\nsys.path.insert(0, '/repo')");
mp.runPython(fs.readFileSync(path.resolve(script), "utf8"));
