'use strict';
// A cutline job driver and three tasks, written from docs/wire-format.md alone.
// Usage: node participant.js --bootstrap HOST:PORT [--prefix cutline.] [--job node-job]
//          [--dir /tmp/node-checkpoints] [--checkpoints 3] [--interval-ms 300] [--timeout-s 60]
const fs = require('fs');
const path = require('path');
const crypto = require('crypto');
const { fileURLToPath, pathToFileURL } = require('url');
const { Kafka, Partitioners, logLevel } = require('kafkajs');
const avro = require('avsc');

const args = { prefix: 'cutline.', job: 'node-job', dir: '/tmp/node-checkpoints', checkpoints: '3',
  'interval-ms': '300', 'timeout-s': '60', schemas: path.join(__dirname, '..', '..', 'schemas') };
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
if (!args.bootstrap) throw new Error('--bootstrap HOST:PORT is required');
const JOB = args.job, ATTEMPT = 1, TASKS = ['task-0', 'task-1', 'task-2'];
const WANTED = Number(args.checkpoints);
const topic = (name) => `${args.prefix}${name}`;
const log = (obj) => console.log(JSON.stringify(obj));

// ---------------------------------------------------------------- encoding (docs: "Encoding")
const MAGIC = Buffer.from([0xc3, 0x01]);
const EMPTY = 0xc15d213aa4d7a795n;
const TABLE = Array.from({ length: 256 }, (_, i) => {
  let fp = BigInt(i);
  for (let j = 0; j < 8; j++) fp = (fp >> 1n) ^ (EMPTY & -(fp & 1n));
  return fp;
});
function fingerprint(canonical) { // CRC-64-AVRO of the parsing canonical form, 8 bytes little-endian
  let fp = EMPTY;
  for (const b of Buffer.from(canonical, 'utf8')) fp = (fp >> 8n) ^ TABLE[Number((fp ^ BigInt(b)) & 0xffn)];
  const out = Buffer.alloc(8);
  out.writeBigUInt64LE(fp);
  return out;
}

// Every writer schema by fingerprint: schemas/*.avsc in one registry (dependencies first),
// each schemas/history/*.avsc in a registry of its own (they are self-contained).
const byFingerprint = new Map(); // hex -> { name, type }
const current = {}; // record name -> { type, fp }
function addWriter(type) {
  const name = type.name.replace(/^cutline\./, '');
  const fp = fingerprint(JSON.stringify(type.getSchema())); // getSchema(): the parsing canonical form
  if (!byFingerprint.has(fp.toString('hex'))) byFingerprint.set(fp.toString('hex'), { name, type });
  return fp;
}
function loadSchemas(dir) {
  const files = {};
  for (const f of fs.readdirSync(dir).filter((f) => f.endsWith('.avsc'))) {
    const schema = JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
    files[`${schema.namespace}.${schema.name}`] = schema;
  }
  const registry = {}, done = new Set();
  const refs = (node, out) => {
    if (typeof node === 'string' && node.startsWith('cutline.')) out.push(node);
    else if (Array.isArray(node)) node.forEach((n) => refs(n, out));
    else if (node && typeof node === 'object') Object.values(node).forEach((n) => refs(n, out));
    return out;
  };
  const load = (name) => {
    if (done.has(name) || !files[name]) return;
    done.add(name);
    refs(files[name], []).forEach(load);
    const type = avro.Type.forSchema(files[name], { registry });
    if (type.typeName === 'record') current[type.name.replace(/^cutline\./, '')] = { type, fp: addWriter(type) };
  };
  Object.keys(files).forEach(load);
  const history = path.join(dir, 'history');
  for (const f of fs.existsSync(history) ? fs.readdirSync(history) : []) {
    if (f.endsWith('.avsc')) addWriter(avro.Type.forSchema(JSON.parse(fs.readFileSync(path.join(history, f), 'utf8'))));
  }
}
function encode(name, record) {
  const { type, fp } = current[name];
  return Buffer.concat([MAGIC, fp, type.toBuffer(record)]);
}
function decode(frame) { // { name, record }, or throws saying why
  if (!frame || frame.length < 10) throw new Error('TRUNCATED_FRAME');
  if (frame[0] !== 0xc3 || frame[1] !== 0x01) throw new Error('BAD_MAGIC');
  const writer = byFingerprint.get(frame.subarray(2, 10).toString('hex'));
  if (!writer) throw new Error(`UNKNOWN_SCHEMA ${frame.subarray(2, 10).toString('hex')}`);
  const reader = current[writer.name].type; // an older writer's record resolves to the current schema
  if (writer.type !== reader && !writer.resolver) writer.resolver = reader.createResolver(writer.type);
  return { name: writer.name, record: reader.fromBuffer(frame.subarray(10), writer.resolver) };
}

// ---------------------------------------------------------------- headers and fencing
const VOID = -1;
function headerEpoch(headers) { // 0 without the header; VOID when doubled or not 1-18 ASCII digits
  const value = (headers || {})['cutline.epoch'];
  if (value === undefined) return 0;
  if (Array.isArray(value) || value === null) return VOID; // kafkajs gives a repeated header as an array
  const text = Buffer.from(value).toString('latin1');
  return /^[0-9]{1,18}$/.test(text) ? Number(text) : VOID;
}
const fences = new Map(); // journal partition -> current epoch
function admit(partition, name, record, epoch) {
  const fence = fences.get(partition) || 0;
  if (name === 'CoordinatorClaimed') {
    if (epoch === VOID || record.epoch <= fence) return false;
    fences.set(partition, record.epoch);
    return true;
  }
  return epoch !== VOID && epoch >= fence;
}

// ---------------------------------------------------------------- storage
function writeAtomic(file, data) { // temp + fsync + rename, creating the directory
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const tmp = `${file}.tmp-${process.pid}-${crypto.randomBytes(4).toString('hex')}`;
  const fd = fs.openSync(tmp, 'w');
  try { fs.writeSync(fd, data); fs.fsyncSync(fd); } finally { fs.closeSync(fd); }
  fs.renameSync(tmp, file);
}
const sha256 = (data) => crypto.createHash('sha256').update(data).digest('hex'); // lowercase hex

function resolveCompletion(completed) { // a completion by reference: its _metadata object, checked
  const ref = completed.metadata;
  if (ref === null) return completed;
  const data = fs.readFileSync(fileURLToPath(ref.uri));
  if (data.length !== ref.size_bytes || sha256(data) !== ref.sha256.toLowerCase()) {
    throw new Error(`${ref.uri} is not the metadata object journaled`);
  }
  const { name, record } = decode(data);
  if (name !== 'CheckpointCompleted' || record.job_id !== completed.job_id
      || record.checkpoint_id !== completed.checkpoint_id) throw new Error(`${ref.uri} holds another record`);
  return record;
}

// ---------------------------------------------------------------- the job
async function main() {
  loadSchemas(args.schemas);
  const kafka = new Kafka({ clientId: 'cutline-node', brokers: [args.bootstrap], logLevel: logLevel.ERROR });
  const producer = kafka.producer({ createPartitioner: Partitioners.JavaCompatiblePartitioner,
    allowAutoTopicCreation: false });
  // Embedded broker: a group join waits half the session timeout, and a parked fetch half its max wait.
  const consumer = kafka.consumer({ groupId: `cutline-node-${JOB}-${process.pid}`, sessionTimeout: 3000,
    rebalanceTimeout: 3000, heartbeatInterval: 500, maxWaitTimeInMs: 10, allowAutoTopicCreation: false });
  await producer.connect();
  await consumer.connect();
  const send = (name, record, headers) => producer.send({ topic: topic({
    JobStatusChanged: 'job-status', CheckpointAcknowledged: 'acks', CheckpointDeclined: 'declines' }[name]),
  messages: [{ key: JOB, value: encode(name, record), headers }] });

  const tasks = TASKS.map((id, i) => ({ id, input: `words:${i}`, position: 0, replies: new Map(),
    files: new Map(), last: { id: -1, epoch: -1 } }));
  const counts = {}, stats = { undecodable: 0, void: 0, completed: [], aborted: 0, barriers: 0, acks: 0 };
  let stopped = false, lastJournal = Date.now(), finishing = false;

  async function onBarrier(barrier, headers) {
    const epoch = headerEpoch(headers);
    if (epoch === VOID || barrier.job_id !== JOB || barrier.attempt !== ATTEMPT) return;
    stats.barriers += 1;
    const echo = headers['cutline.epoch'] === undefined ? {} : { 'cutline.epoch': Buffer.from(headers['cutline.epoch']) };
    for (const task of tasks) {
      let reply = task.replies.get(barrier.checkpoint_id);
      if (!reply) {
        if (barrier.checkpoint_id <= task.last.id && epoch <= task.last.epoch) continue; // stale
        task.last = { id: barrier.checkpoint_id, epoch };
        task.position += 10; // the records this task has read before the cut
        const data = Buffer.from(JSON.stringify({ task: task.id, position: task.position }));
        const uri = `${barrier.location.replace(/\/$/, '')}/${encodeURIComponent(task.id)}`;
        try {
          writeAtomic(fileURLToPath(uri), data);
          task.files.set(barrier.checkpoint_id, uri);
          reply = ['CheckpointAcknowledged', { job_id: JOB, checkpoint_id: barrier.checkpoint_id, attempt: ATTEMPT,
            task_id: task.id, timestamp_ms: Date.now(),
            state: { uri, size_bytes: data.length, sha256: sha256(data), inline: null },
            offsets: { [task.input]: task.position }, metrics: { bytes: data.length } }];
        } catch (err) {
          reply = ['CheckpointDeclined', { job_id: JOB, checkpoint_id: barrier.checkpoint_id, attempt: ATTEMPT,
            task_id: task.id, timestamp_ms: Date.now(), reason: 'TASK_CHECKPOINT_FAILURE', message: String(err) }];
        }
        task.replies.set(barrier.checkpoint_id, reply);
      }
      await send(reply[0], reply[1], echo); // a re-sent barrier gets the same reply again
      if (reply[0] === 'CheckpointAcknowledged') stats.acks += 1;
    }
  }

  function onJournal(message, partition) {
    lastJournal = Date.now();
    let decoded;
    try { decoded = decode(message.value); } catch (err) {
      stats.undecodable += 1;
      log({ undecodable: String(err.message), partition, offset: message.offset });
      return;
    }
    const { name, record } = decoded;
    counts[name] = (counts[name] || 0) + 1;
    if (!admit(partition, name, record, headerEpoch(message.headers))) { stats.void += 1; return; }
    if (record.job_id !== JOB) return;
    if (name === 'CheckpointCompleted' && record.attempt === ATTEMPT) {
      let full;
      try { full = resolveCompletion(record); } catch (err) { // ignored, as a malformed completion
        log({ ignored: record.checkpoint_id, why: String(err.message) });
        return;
      }
      stats.completed.push(full.checkpoint_id);
      log({ completed: full.checkpoint_id, tasks: Object.keys(full.handles).length, offsets: full.offsets,
        by_reference: record.metadata !== null });
      for (const task of tasks) { // keep the newest completed snapshot only (retained = 1)
        for (const [id, uri] of task.files) {
          if (id < full.checkpoint_id) { fs.rmSync(fileURLToPath(uri), { force: true }); task.files.delete(id); }
        }
      }
    } else if (name === 'CheckpointAborted') {
      stats.aborted += 1;
      for (const task of tasks) {
        const uri = task.files.get(record.checkpoint_id);
        if (uri && !stats.completed.includes(record.checkpoint_id)) fs.rmSync(fileURLToPath(uri), { force: true });
      }
    } else if (name === 'SchedulerStopped') {
      stopped = true;
    }
  }

  await consumer.subscribe({ topics: [topic('barriers'), topic('checkpoints')], fromBeginning: true });
  await consumer.run({ eachMessage: async ({ topic: t, partition, message }) => {
    if (t === topic('checkpoints')) return onJournal(message, partition);
    let decoded;
    try { decoded = decode(message.value); } catch (err) { stats.undecodable += 1; return; }
    if (decoded.name === 'CheckpointBarrier') await onBarrier(decoded.record, message.headers || {});
  } });

  const location = pathToFileURL(path.resolve(args.dir)).href; // file:///abs/path, need not exist
  await send('JobStatusChanged', { job_id: JOB, status: 'RUNNING', timestamp_ms: Date.now(), attempt: ATTEMPT,
    tasks: TASKS, config: { interval_ms: Number(args['interval-ms']), timeout_ms: 10000, tolerable_failures: 100,
      location }, error: null, restored_checkpoint_id: null, restored_location: null });
  log({ running: JOB, tasks: TASKS, location });

  const deadline = Date.now() + Number(args['timeout-s']) * 1000;
  while (Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    if (!finishing && stats.completed.length >= WANTED) {
      finishing = true; // enough: finish the job, then read the journal until it is quiet
      await send('JobStatusChanged', { job_id: JOB, status: 'FINISHED', timestamp_ms: Date.now(),
        attempt: ATTEMPT, tasks: [], config: null, error: null, restored_checkpoint_id: null, restored_location: null });
    }
    if (stopped && Date.now() - lastJournal > 1500) break;
  }
  await consumer.disconnect();
  await producer.disconnect();
  const ok = stats.completed.length >= WANTED && stats.undecodable === 0;
  log({ summary: { ok, job: JOB, decoded: counts, ...stats } });
  process.exitCode = ok ? 0 : 1;
}

main().catch((err) => { console.error(err); process.exit(2); });
