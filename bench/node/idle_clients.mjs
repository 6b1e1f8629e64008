// The official socket.io-client, for bench/node_memory_bench.py: one client per token of
// TOKENS_FILE (one a line), each connecting with ?v=VERSION over TRANSPORTS (comma-separated),
// CONCURRENCY at a time, authenticating, then staying open and idle until stdin closes.
// Prints one JSON line once every client is done: {"authenticated", "failed", "seconds"}.
//
//   node idle_clients.mjs URL VERSION TRANSPORTS CONCURRENCY TOKENS_FILE
import { readFileSync } from "node:fs";
import { io } from "socket.io-client";

const [url, version, transports, concurrency, tokensFile] = process.argv.slice(2);
const tokens = readFileSync(tokensFile, "utf8").split("\n").filter((line) => line);
const sockets = [];
let authenticated = 0;
let failed = 0;

function open(token) {
  return new Promise((resolve) => {
    const socket = io(url, {
      query: { v: version },
      transports: transports.split(","),
      reconnection: false,
      forceNew: true,
    });
    sockets.push(socket);
    socket.on("connect_error", () => { failed += 1; resolve(); });
    socket.on("alert", () => { failed += 1; resolve(); });
    socket.on("connect", () => {
      socket.emit("authenticate", token, () => { authenticated += 1; resolve(); });
    });
  });
}

const started = Date.now();
let next = 0;
await Promise.all(
  Array.from({ length: Number(concurrency) }, async () => {
    while (next < tokens.length) await open(tokens[next++]);
  }),
);
console.log(JSON.stringify({ authenticated, failed, seconds: (Date.now() - started) / 1000 }));
process.stdin.resume();
process.stdin.on("end", () => {
  for (const socket of sockets) socket.close();
  setTimeout(() => process.exit(0), 200);
});
