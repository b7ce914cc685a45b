// rhea as a Corda peer over mutual TLS: sends P2P-shaped messages, each in the transfer message-format given.
//   NODE_PATH=<dir with rhea> node rhea_p2p_client.js PORT ADDRESS TLS_DIR FORMAT [FORMAT ...]
// TLS_DIR holds client.pem (the TLS chain), client.key and ca.pem (the network root); host names are not
// checked (Corda certificates name legal entities, not hosts). Message i carries Corda's required P2P
// application properties and one Data body "rhea-<i>", and is sent with transfer message-format FORMAT[i]
// (rhea's Sender.send(bytes, tag, format)). Prints one JSON line: the outcome of each (condition for a
// rejection), or the connection / link error.
'use strict';
const fs = require('fs');
const path = require('path');
const rhea = require('rhea');
const [port, address, tls, ...formats] = process.argv.slice(2);
const result = { outcomes: [], error: null };
let sent = 0;

const container = rhea.create_container({ id: 'rhea-p2p-client' });
const connection = container.connect({
  host: '127.0.0.1', port: parseInt(port, 10), transport: 'tls', reconnect: false,
  username: 'SystemUsers/Peer', password: 'unused', // (TLS, not SASL, authenticates a peer)
  key: fs.readFileSync(path.join(tls, 'client.key')), cert: fs.readFileSync(path.join(tls, 'client.pem')),
  ca: fs.readFileSync(path.join(tls, 'ca.pem')), rejectUnauthorized: true, checkServerIdentity: () => undefined,
});
const sender = connection.open_sender({ target: { address } });

function done() {
  if (result.outcomes.length === formats.length) {
    console.log(JSON.stringify(result));
    connection.close();
  }
}

container.on('sendable', () => {
  while (sender.sendable() && sent < formats.length) {
    const i = sent++;
    const message = {
      durable: true,
      message_id: `rhea-${i}`,
      application_properties: {
        'platform-topic': 'test.p2p', 'platform-version': rhea.types.wrap_int(1), 'corda-vendor': 'rhea',
        'release-version': '1', 'sender-uuid': 'rhea', 'send-seq-no': rhea.types.wrap_long(i),
        '_AMQ_DUPL_ID': `rhea-${i}`,
      },
      body: rhea.message.data_section(Buffer.from(`rhea-${i}`)),
    };
    sender.send(rhea.message.encode(message), undefined, parseInt(formats[i], 10));
  }
});
container.on('accepted', () => { result.outcomes.push('accepted'); done(); });
container.on('rejected', (ctx) => {
  const error = ctx.delivery.remote_state && ctx.delivery.remote_state.error;
  result.outcomes.push(error ? error.condition : 'rejected');
  done();
});
container.on('released', () => { result.outcomes.push('released'); done(); });
container.on('sender_error', (ctx) => { result.error = String(ctx.sender.error && ctx.sender.error.condition); console.log(JSON.stringify(result)); connection.close(); });
container.on('connection_error', (ctx) => { result.error = String(ctx.connection.error && ctx.connection.error.condition); });
container.on('error', (e) => { result.error = String(e); console.log(JSON.stringify(result)); process.exit(0); });
container.on('disconnected', (ctx) => { if (ctx.error) { result.error = String(ctx.error); console.log(JSON.stringify(result)); } });
