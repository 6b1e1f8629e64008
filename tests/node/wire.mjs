// The official socket.io-client against a running gateway, for tests/test_official_client.py:
// what a JavaScript client sees on the wire, one JSON line on stdout per observation.
//
//   node wire.mjs URL SCENARIO [OPTIONS]
//
// OPTIONS is a JSON object:
//   query       the handshake's query, e.g. {"v": "v1.3", "proto": "2"} (default {})
//   namespace   appended to URL, e.g. "/other" (default: none, the namespace "/")
//   transports  socket.io-client's transports (default: its own, long-polling then websocket)
//   token       listen: the token to authenticate with
//   options     listen: authenticate's options, e.g. {"since": "..."}; absent: (token, ack)
//
// Scenarios:
//   refused  connect and expect a refusal: prints {"type": "connect_error", "message", "data"}
//            (or {"type": "connect"} if the gateway let it in), then exits.
//   listen   connect, print {"type": "connect"}, emit authenticate (token[, options], ack), and
//            print what follows, in order, until the gateway disconnects or stdin closes:
//              {"type": "ack", "args": [...]}            every argument the ack received
//              {"type": "alert", "args": [...]}          an alert, all its arguments
//              {"type": "event", "name", "args": [...]}  any other event, all its arguments
//              {"type": "connect_error", "message", "data"}
//              {"type": "disconnect", "reason"}          then it exits
//
// Whatever happens it exits within LIFETIME ms, printing {"type": "timeout"} first.
import { io } from "socket.io-client";

const LIFETIME = 20000;
const [url, scenario, optionsJson = "{}"] = process.argv.slice(2);
const options = JSON.parse(optionsJson);

function print(observation) {
  process.stdout.write(JSON.stringify(observation) + "\n");
}

let socket = null;
function finish(code = 0) {
  if (socket !== null) socket.close();
  process.stdout.write("", () => process.exit(code)); // once everything printed is written
}
setTimeout(() => { print({ type: "timeout" }); finish(1); }, LIFETIME);

if (!url || !["refused", "listen"].includes(scenario)) {
  process.stderr.write("usage: node wire.mjs URL refused|listen [OPTIONS]\n");
  process.exit(2);
}

socket = io(url + (options.namespace ?? ""), {
  query: options.query ?? {},
  ...(options.transports ? { transports: options.transports } : {}),
  reconnection: false,
  forceNew: true,
});

socket.on("connect_error", (error) => {
  print({ type: "connect_error", message: error.message, data: error.data ?? null });
  finish();
});

if (scenario === "refused") {
  socket.on("connect", () => { print({ type: "connect" }); finish(); });
} else {
  socket.on("connect", () => {
    print({ type: "connect", transport: socket.io.engine.transport.name });
    const ack = (...args) => print({ type: "ack", args });
    if ("options" in options) socket.emit("authenticate", options.token, options.options, ack);
    else socket.emit("authenticate", options.token, ack);
  });
  socket.onAny((name, ...args) => {
    print(name === "alert" ? { type: "alert", args } : { type: "event", name, args });
  });
  socket.on("disconnect", (reason) => {
    print({ type: "disconnect", reason });
    finish();
  });
  process.stdin.on("end", () => finish());
  process.stdin.resume();
}
