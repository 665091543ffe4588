// A Node client of the engine, from the .proto alone: start a workflow, watch it to its end,
// and read its state. Run from the repository root after `make node-tools`:
//   node proto/examples/node/client.mjs localhost:50051
// It prints one line per event, then the final status and the steps' outputs as JSON.
import { randomUUID } from "node:crypto";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const PROTO_DIR = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const definition = protoLoader.loadSync("workflow_engine/v1/workflow_engine.proto", {
  includeDirs: [PROTO_DIR],
  keepCase: true, // field names as in the .proto (task_id), not lowerCamelCase (taskId)
  enums: String, // enum values by name ("SUCCEEDED"), not number
  longs: String, // uint64 sequence numbers as strings
  defaults: true, // unset fields with their zero value
  oneofs: true,
});
const { WorkflowEngine } = grpc.loadPackageDefinition(definition).workflow_engine.v1;

// google.protobuf.Struct and Value arrive as the protobuf messages they are, not as plain
// JSON, and with keepCase too their fields are lowerCamelCase ({fields: {k: {stringValue:
// "..."}}}): proto-loader takes the well-known types from protobufjs's own definitions, not
// from a .proto, so keepCase does not reach them. Convert both ways:
function fromValue(value) {
  switch (value.kind) {
    case "nullValue":
      return null;
    case "numberValue":
    case "stringValue":
    case "boolValue":
      return value[value.kind];
    case "structValue":
      return fromStruct(value.structValue);
    case "listValue":
      return value.listValue.values.map(fromValue);
    default:
      return undefined;
  }
}
function fromStruct(struct) {
  return Object.fromEntries(
    Object.entries(struct?.fields ?? {}).map(([k, v]) => [k, fromValue(v)]),
  );
}
// (for what you send: a check's `equals`, preference layers)
function toValue(json) {
  if (json === null) return { nullValue: "NULL_VALUE" };
  if (Array.isArray(json)) return { listValue: { values: json.map(toValue) } };
  if (typeof json === "object") return { structValue: toStruct(json) };
  return { [`${typeof json === "boolean" ? "bool" : typeof json}Value`]: json };
}
function toStruct(json) {
  return { fields: Object.fromEntries(Object.entries(json).map(([k, v]) => [k, toValue(v)])) };
}

const address = process.argv[2] ?? "localhost:50051";
const client = new WorkflowEngine(address, grpc.credentials.createInsecure());
const call = (method, request) =>
  new Promise((resolve, reject) =>
    client[method](request, (error, answer) => (error ? reject(error) : resolve(answer))),
  );

const task_id = randomUUID();
const started = await call("StartWorkflow", {
  task_id,
  task: {
    prompt: "Count to three and report as JSON",
    steps: [
      {
        id: "count",
        command: ["sh", "-c", 'echo \'{"count": 3, "unit": "steps"}\''],
        expect: [{ kind: "json_field_equals", field: "count", equals: toValue(3) }],
      },
    ],
    preferences: [toStruct({ style: { verbose: false } })],
  },
});
console.log(`started ${task_id}: ${started.status}, workflow ${started.workflow_status}`);

await new Promise((resolve, reject) => {
  const events = client.WatchWorkflow({ task_id });
  events.on("data", (e) =>
    console.log(`#${e.sequence} ${e.kind} ${e.node_id || e.status} ${e.detail}`.trimEnd()),
  );
  events.on("end", resolve);
  events.on("error", reject);
});

const workflow = await call("GetWorkflow", { task_id });
const state = fromStruct(workflow.state);
console.log(
  JSON.stringify({
    status: workflow.status,
    outputs: Object.fromEntries(
      Object.entries(state.steps).map(([id, s]) => [id, s.result.stdout.trim()]),
    ),
    preferences_effective: state.preferences_effective,
  }),
);
client.close();
process.exit(workflow.status === "SUCCEEDED" ? 0 : 1);
