// Turns a kustomize-rendered overlay into what `podman kube play` runs, for
// tools/container-test (Podman runs Pods and ConfigMaps, not DaemonSets,
// Services or Namespaces, and takes Secrets from its own secret store).
//
//   node podman-pod.mjs RENDERED OUT_DIR [--pools=FILE] [--tokens=FILE]
//
// Writes OUT_DIR/play.yaml: the ConfigMaps and one Pod, named after the
// DaemonSet, whose spec is the DaemonSet's pod template unchanged; and
// OUT_DIR/secrets/NAME.yaml, one Secret per file (`podman secret create NAME
// FILE` stores it; the Pod's secret volumes then find it by name). Where
// Podman 4.3 departs from Kubernetes, the code says so and works around it.
// --pools and --tokens replace the content of the pools ConfigMap and of the
// tokens Secret with a file's, to show how the daemon treats bad input.

import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { parseAllDocuments, stringify } from "yaml";

const [rendered, outDir, ...flags] = process.argv.slice(2);
const options = Object.fromEntries(flags.map((f) => {
  const m = /^--(pools|tokens)=(.+)$/.exec(f);
  if (!m) {
    console.error(`unknown argument ${f}`);
    process.exit(2);
  }
  return [m[1], m[2]];
}));

const docs = parseAllDocuments(readFileSync(rendered, "utf8"))
                 .map((d) => d.toJS())
                 .filter((d) => d !== null);
const daemonSets = docs.filter((d) => d.kind === "DaemonSet");
if (daemonSets.length !== 1) {
  console.error(`${rendered}: expected one DaemonSet, found ${daemonSets.length}`);
  process.exit(1);
}
const ds = daemonSets[0];

const play = [];
for (const cm of docs.filter((d) => d.kind === "ConfigMap")) {
  if (options.pools && cm.data && "pools.textproto" in cm.data) {
    cm.data["pools.textproto"] = readFileSync(options.pools, "utf8");
  }
  play.push(cm);
}
// Podman 4.3 dereferences a secret volume's `optional` without checking
// that it is set (Kubernetes defaults it to false): say it explicitly.
for (const volume of ds.spec.template.spec.volumes ?? []) {
  if (volume.secret && volume.secret.optional === undefined) {
    volume.secret.optional = false;
  }
}
play.push({
  apiVersion: "v1",
  kind: "Pod",
  metadata: {
    name: ds.metadata.name,
    labels: ds.spec.template.metadata?.labels,
    annotations: {
      ...ds.spec.template.metadata?.annotations,
      // Podman 4.3 removes a run-once init container while it may still be
      // running and then fails the whole play; keep it instead.
      "io.podman.annotations.init.container.type": "always",
    },
  },
  spec: ds.spec.template.spec,
});
mkdirSync(path.join(outDir, "secrets"), { recursive: true });
writeFileSync(path.join(outDir, "play.yaml"),
              play.map((d) => stringify(d)).join("---\n"));

// Podman 4.3 writes a Secret's `data` values into the volume as they are,
// without base64-decoding them, and ignores `stringData`. So its copy of a
// Secret carries the decoded values in `data`.
for (const secret of docs.filter((d) => d.kind === "Secret")) {
  const values = {};
  for (const [key, b64] of Object.entries(secret.data ?? {})) {
    values[key] = Buffer.from(b64, "base64").toString("utf8");
  }
  Object.assign(values, secret.stringData);
  if (options.tokens && "tokens.textproto" in values) {
    values["tokens.textproto"] = readFileSync(options.tokens, "utf8");
  }
  delete secret.stringData;
  secret.data = values;
  writeFileSync(path.join(outDir, "secrets", `${secret.metadata.name}.yaml`),
                stringify(secret));
}
