// A small in-memory AMQP 1.0 queue broker on rhea (pure JavaScript): the interop tests' rhea peer.
//   NODE_PATH=<dir with rhea> node rhea_broker.js PORT
// Listens on 127.0.0.1; offers SASL ANONYMOUS and PLAIN (any credentials); stores messages per address and
// accepts them; receivers get them back in order. Prints "READY <port>" when listening.
'use strict';
const rhea = require('rhea');
const port = parseInt(process.argv[2], 10);
const queues = new Map();
const consumers = new Map();
const get = (m, k) => { if (!m.has(k)) m.set(k, []); return m.get(k); };

function dispatch(addr) {
  const msgs = get(queues, addr);
  for (const link of get(consumers, addr)) {
    while (msgs.length && link.sendable()) link.send(msgs.shift());
  }
}

const container = rhea.create_container({ id: 'rhea-interop-broker' });
container.sasl_server_mechanisms.enable_anonymous();
container.sasl_server_mechanisms.enable_plain(() => true);
container.on('sender_open', (ctx) => {
  const addr = (ctx.sender.remote.attach.source || {}).address;
  ctx.sender.set_source({ address: addr });
  get(consumers, addr).push(ctx.sender);
});
// rhea 3.0.5 can write a transfer before the attach of its link if it sends while handling the peer's
// attach+flow; deferring by one event-loop turn keeps the attach first.
container.on('sendable', (ctx) => setImmediate(() => dispatch(ctx.sender.source.address)));
container.on('sender_close', (ctx) => {
  const l = get(consumers, ctx.sender.source.address); const i = l.indexOf(ctx.sender); if (i >= 0) l.splice(i, 1);
});
container.on('disconnected', (ctx) => {
  for (const l of consumers.values()) for (let i = l.length - 1; i >= 0; i--) if (l[i].connection === ctx.connection) l.splice(i, 1);
});
container.on('receiver_open', (ctx) => {
  ctx.receiver.set_target({ address: (ctx.receiver.remote.attach.target || {}).address });
});
container.on('message', (ctx) => {
  const addr = (ctx.receiver.target && ctx.receiver.target.address) || ctx.message.to || '';
  get(queues, addr).push(ctx.message);
  dispatch(addr);
});
const server = container.listen({ host: '127.0.0.1', port });
server.on('listening', () => console.log(`READY ${port}`));
process.on('SIGTERM', () => process.exit(0));
