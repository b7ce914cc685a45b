// A rhea client that ignores link credit on one link while another link on the same connection behaves:
//   NODE_PATH=<dir with rhea> node rhea_overrun_client.js PORT FLOOD_COUNT FLOOD_BYTES STEADY_COUNT
// Link "flood" sends FLOOD_COUNT messages of FLOOD_BYTES at once, whatever credit it was granted: its
// has_credit() is made to answer true, so rhea's session writes its transfers as if it always had credit (a
// client that ignores credit); link "steady" sends STEADY_COUNT small messages, only while it has credit. Prints one JSON line: what happened to each link (accepted counts, the flood link's detach error).
'use strict';
const rhea = require('rhea');
const [port, floodCount, floodBytes, steadyCount] = process.argv.slice(2, 6).map((s) => parseInt(s, 10));
const result = { flood_sent: 0, flood_accepted: 0, flood_error: null, steady_sent: 0, steady_accepted: 0 };
let floodClosed = false;
let finished = false;

const container = rhea.create_container({ id: 'rhea-overrun-client' });
const connection = container.connect({
  host: '127.0.0.1', port, username: 'guest', password: 'guest', reconnect: false, idle_time_out: 0,
});
const flood = connection.open_sender({ name: 'flood', target: { address: 'flood' } });
const steady = connection.open_sender({ name: 'steady', target: { address: 'steady' } });
flood.has_credit = () => true;
const body = Buffer.alloc(floodBytes, 0x61);

function finish() {
  if (finished || !floodClosed || result.steady_accepted < steadyCount) return;
  finished = true;
  console.log(JSON.stringify(result));
  connection.close();
}

container.on('sender_open', (ctx) => {
  if (ctx.sender !== flood) return;
  for (let i = 0; i < floodCount; i++) { flood.send({ body: rhea.message.data_section(body) }); result.flood_sent++; }
});
container.on('sendable', (ctx) => {
  if (ctx.sender !== steady) return;
  while (steady.sendable() && result.steady_sent < steadyCount) {
    steady.send({ body: rhea.message.data_section(Buffer.from(`steady ${result.steady_sent}`)) });
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
