// A rhea client that ignores link credit on one link while another link on the same connection behaves:
//   NODE_PATH=<dir with rhea> node rhea_overrun_client.js PORT FLOOD_COUNT FLOOD_BYTES STEADY_COUNT
//       [FLOOD_ADDRESS STEADY_ADDRESS [TLS_DIR]]
// The links' target addresses are "flood" and "steady" unless given. With TLS_DIR (client.pem, client.key,
// ca.pem: a Corda peer's TLS identity and the network root) it connects over mutual TLS, host names not
// checked. Every message carries Corda's P2P application properties (_AMQ_DUPL_ID "flood-<i>" or
// "steady-<i>"), so a Corda inbox stores it.
// Link "flood" sends FLOOD_COUNT messages of FLOOD_BYTES at once, whatever credit it was granted: its
// has_credit() is made to answer true, so rhea's session writes its transfers as if it always had credit (a
// client that ignores credit); link "steady" sends STEADY_COUNT small messages, only while it has credit. Prints one JSON line: what happened to each link (accepted counts, the flood link's detach error).
'use strict';
const rhea = require('rhea');
const fs = require('fs');
const path = require('path');
const [port, floodCount, floodBytes, steadyCount] = process.argv.slice(2, 6).map((s) => parseInt(s, 10));
const [floodAddress = 'flood', steadyAddress = 'steady', tls] = process.argv.slice(6);
const result = { flood_sent: 0, flood_accepted: 0, flood_error: null, steady_sent: 0, steady_accepted: 0 };
let floodClosed = false;
let finished = false;

const container = rhea.create_container({ id: 'rhea-overrun-client' });
const options = { host: '127.0.0.1', port, username: 'guest', password: 'guest', reconnect: false, idle_time_out: 0 };
if (tls) {
  Object.assign(options, {
    transport: 'tls', key: fs.readFileSync(path.join(tls, 'client.key')),
    cert: fs.readFileSync(path.join(tls, 'client.pem')), ca: fs.readFileSync(path.join(tls, 'ca.pem')),
    rejectUnauthorized: true, checkServerIdentity: () => undefined,
  });
}
const connection = container.connect(options);
const flood = connection.open_sender({ name: 'flood', target: { address: floodAddress } });
const steady = connection.open_sender({ name: 'steady', target: { address: steadyAddress } });
flood.has_credit = () => true;
const body = Buffer.alloc(floodBytes, 0x61);

function p2p(id, seq) {
  return {
    'platform-topic': 'test.p2p', 'platform-version': rhea.types.wrap_int(1), 'corda-vendor': 'rhea',
    'release-version': '1', 'sender-uuid': 'rhea', 'send-seq-no': rhea.types.wrap_long(seq), '_AMQ_DUPL_ID': id,
  };
}

function finish() {
  if (finished || !(floodClosed || result.flood_accepted === floodCount) || result.steady_accepted < steadyCount) return;
  finished = true;
  console.log(JSON.stringify(result));
  connection.close();
}

container.on('sender_open', (ctx) => {
  if (ctx.sender !== flood) return;
  for (let i = 0; i < floodCount; i++) { flood.send({ application_properties: p2p(`flood-${i}`, i), body: rhea.message.data_section(body) }); result.flood_sent++; }
});
container.on('sendable', (ctx) => {
  if (ctx.sender !== steady) return;
  while (steady.sendable() && result.steady_sent < steadyCount) {
    const i = result.steady_sent;
    steady.send({ application_properties: p2p(`steady-${i}`, i), body: rhea.message.data_section(Buffer.from(`steady ${i}`)) });
    result.steady_sent++;
  }
});
container.on('accepted', (ctx) => {
  if (ctx.sender === steady) result.steady_accepted++; else result.flood_accepted++;
  finish();
});
container.on('sender_error', (ctx) => {
  if (ctx.sender === flood) result.flood_error = ctx.sender.error ? ctx.sender.error.condition : 'unknown';
});
container.on('sender_close', (ctx) => {
  if (ctx.sender === flood) { floodClosed = true; finish(); }
});
container.on('connection_error', (ctx) => { result.connection_error = String(ctx.connection.error && ctx.connection.error.condition); });
container.on('disconnected', (ctx) => {
  if (!finished) { result.error = `disconnected: ${ctx.error || 'closed'}`; console.log(JSON.stringify(result)); finished = true; }
});
container.on('connection_close', () => { process.exit(0); });
