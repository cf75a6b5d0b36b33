// Loads a generated trace of N events into the real trace processor (tests/perfetto/tp.mjs: the
// Perfetto v52 WASM build the tests use, under Node) without a file on disk, and says whether it
// loaded: for bench_perfetto.py, which writes the blocks the trace is made of.
//
//   node benchmarks/tp_capacity.mjs json BLOCK.json N
//       BLOCK.json: {"events": [[text before ts, ts µs from the step start, text after], ...],
//                    "step_us": step length}; the step is repeated until N events
//   node benchmarks/tp_capacity.mjs proto HEAD.bin BLOCK.bin EVENTS_PER_BLOCK N
//       HEAD.bin: descriptors and sequence header; BLOCK.bin: one step's event packets (incremental
//       timestamps, so the same bytes repeat as the next step)
//
// TP_CAP_MB=M caps the engine's WASM memory at M MiB (a growth past it fails, as one past the 4 GiB
// of a 32-bit WASM address space does), so that limits are found in minutes.
//
// Prints one JSON line: {"format", "events", "slices", "load_s", "peak_mb", "ok", "error"}.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const { TraceProcessor } = await import(path.join(HERE, '..', 'tests', 'perfetto', 'tp.mjs'));
const CHUNK = 8 << 20;
const CAP = Number(process.env.TP_CAP_MB || 0) * 1048576;
let peak = 0;
const grow = WebAssembly.Memory.prototype.grow;
WebAssembly.Memory.prototype.grow = function (pages) {
  if (CAP && this.buffer.byteLength + pages * 65536 > CAP) throw new RangeError('memory cap reached');
  const old = grow.call(this, pages);
  peak = Math.max(peak, this.buffer.byteLength);
  return old;
};

function* jsonChunks(block, n) {
  const enc = new TextEncoder();
  const per = block.events.length;
  let parts = ['['], size = 1, made = 0;
  for (let k = 0; made < n; k++) {
    const base = 1_700_000_000_000_000 + k * block.step_us;
    for (let i = 0; i < per && made < n; i++, made++) {
      const [before, ts, after] = block.events[i];
      const line = before + (base + ts) + after + '\n';
      parts.push(line);
      size += line.length;
      if (size >= CHUNK) { yield enc.encode(parts.join('')); parts = []; size = 0; }
    }
  }
  parts.push(']\n');
  yield enc.encode(parts.join(''));
}

function* protoChunks(head, block, perBlock, n) {
  yield head;
  const copies = Math.max(1, Math.floor(CHUNK / block.length));
  const big = new Uint8Array(block.length * copies);
  for (let i = 0; i < copies; i++) big.set(block, i * block.length);
  let blocks = Math.ceil(n / perBlock);
  while (blocks > 0) {
    const take = Math.min(blocks, copies);
    yield big.subarray(0, take * block.length);
    blocks -= take;
  }
}

const [format, ...rest] = process.argv.slice(2);
let chunks, n;
if (format === 'json') {
  n = Number(rest[1]);
  chunks = jsonChunks(JSON.parse(fs.readFileSync(rest[0], 'utf8')), n);
} else {
  n = Number(rest[3]);
  chunks = protoChunks(fs.readFileSync(rest[0]), fs.readFileSync(rest[1]), Number(rest[2]), n);
}
const out = { format, events: n, slices: null, load_s: null, peak_mb: null, ok: false, error: null };
const t0 = process.hrtime.bigint();
try {
  const tp = await TraceProcessor.create();
  for (const c of chunks) tp.parse(c);
  tp.notifyEof();
  const r = await tp.query('select count(*) from slice');
  out.slices = Number(r.rows[0][0]);
  out.ok = true;
} catch (e) {
  out.error = String(e && e.message || e).slice(0, 300);
}
out.load_s = Number(process.hrtime.bigint() - t0) / 1e9;
out.peak_mb = peak / 1048576;
console.log(JSON.stringify(out));
process.exit(0);
