// Schema checks of kvbroker's Kubernetes manifests, without a cluster.
//
//   node validate.mjs OUT_DIR FILE... [--rendered FILE...]
//
// Every document of every FILE (resource files, and after --rendered the
// kustomize-rendered overlays) must be a Kubernetes object that this project
// uses. Two passes:
//   1. the kubernetes-models class of its apiVersion and kind validates it
//      against the OpenAPI schema (types, required fields, formats);
//   2. each document becomes a typed TypeScript constant in OUT_DIR and
//      `tsc --noEmit --strict` checks them, which also refuses fields the
//      schema does not know (a misspelt field passes the first pass).
// In a rendering, every ConfigMap and Secret a pod template mounts must be
// in the same rendering (Kustomize renames generated ones with a hash and
// rewrites only the references it can match), except the Secrets that the
// operator provides (kvbroker-tls).
// Exit 0 when both passes hold; every finding is printed.

import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);

// kube-scheduler's configuration file is no API object and has no model
// class: its documents get the strict typed pass only, against the types
// in kube-scheduler-config.d.ts.
const schedulerConfigVersion = "kubescheduler.config.k8s.io/v1";
const schedulerConfigTypes = path.join(here, "kube-scheduler-config.js");

// apiVersion -> the module with its models. Core is "v1".
function moduleFor(apiVersion) {
  if (apiVersion === schedulerConfigVersion) return schedulerConfigTypes;
  if (apiVersion.startsWith("monitoring.coreos.com/")) {
    return `@kubernetes-models/prometheus-operator/${apiVersion}`;
  }
  return `kubernetes-models/${apiVersion}`;
}

const [outDir, ...rest] = process.argv.slice(2);
const split = rest.indexOf("--rendered");
const files = rest.filter((f) => f !== "--rendered");
const rendered = new Set(split < 0 ? [] : rest.slice(split + 1));
if (!outDir || files.length === 0) {
  console.error("usage: node validate.mjs OUT_DIR FILE... [--rendered FILE...]");
  process.exit(2);
}
const providedByOperator =
    new Set(["Secret/kvbroker-tls", "Secret/kvbroker-extender-tls"]);

// The ConfigMaps and Secrets the pod templates in `objs` mount, missing
// from `objs`.
function missingReferences(objs) {
  const defined = new Set(objs.map((o) => `${o.kind}/${o.metadata?.name}`));
  const missing = [];
  for (const o of objs) {
    for (const v of o.spec?.template?.spec?.volumes ?? []) {
      const ref = v.configMap ? `ConfigMap/${v.configMap.name}`
                : v.secret ? `Secret/${v.secret.secretName}` : null;
      if (ref && !defined.has(ref) && !providedByOperator.has(ref)) {
        missing.push(`${o.kind}/${o.metadata?.name} mounts ${ref}`);
      }
    }
  }
  return missing;
}

let failures = 0;
const fail = (where, message) => {
  failures++;
  console.error(`FAIL ${where}: ${message}`);
};

const imports = new Map();  // module -> set of interface names
const constants = [];
let checked = 0;

for (const file of files) {
  const docs = parseAllDocuments(readFileSync(file, "utf8"));
  if (rendered.has(file)) {
    for (const m of missingReferences(
             docs.filter((d) => d.errors.length === 0).map((d) => d.toJS())
                 .filter((o) => o !== null))) {
      fail(file, `${m}, which the rendering does not hold`);
    }
  }
  docs.forEach((doc, i) => {
    const where = `${file}#${i}`;
    if (doc.errors.length > 0) {
      fail(where, `YAML: ${doc.errors.map((e) => e.message).join("; ")}`);
      return;
    }
    const obj = doc.toJS();
    if (obj === null) return;  // an empty document
    const { apiVersion, kind } = obj;
    if (typeof apiVersion !== "string" || typeof kind !== "string") {
      fail(where, "not a Kubernetes object (no apiVersion and kind)");
      return;
    }
    const name = `${kind}/${obj.metadata?.name ?? "?"}`;
    const typesOnly = apiVersion === schedulerConfigVersion &&
                      kind === "KubeSchedulerConfiguration";
    let Model;
    try {
      Model = typesOnly ? undefined : require(moduleFor(apiVersion))[kind];
    } catch (e) {
      Model = undefined;
    }
    if (!typesOnly && typeof Model !== "function") {
      fail(where, `no schema for ${apiVersion} ${kind}`);
      return;
    }
    try {
      if (!typesOnly) new Model(obj).validate();
    } catch (e) {
      fail(`${where} ${name}`, e.message);
      return;
    }
    const iface = `I${kind}`;
    const mod = moduleFor(apiVersion);
    if (!imports.has(mod)) imports.set(mod, new Set());
    imports.get(mod).add(iface);
    constants.push(
        `// ${where} ${name}\n` +
        `export const doc${constants.length}: ${iface} = ` +
        `${JSON.stringify(obj, null, 2)};\n`);
    checked++;
  });
}

mkdirSync(outDir, { recursive: true });
const source =
    [...imports].map(([mod, names]) =>
        `import type { ${[...names].sort().join(", ")} } from "${mod}";\n`)
        .join("") +
    "\n" + constants.join("\n");
const tsFile = path.join(outDir, "manifests.ts");
writeFileSync(tsFile, source);
writeFileSync(path.join(outDir, "tsconfig.json"), JSON.stringify({
  compilerOptions: {
    strict: true,
    noEmit: true,
    target: "ES2022",
    module: "NodeNext",
    moduleResolution: "NodeNext",
    typeRoots: [],
    types: [],
    baseUrl: here,
    paths: { "*": [path.join(here, "node_modules", "*")] },
    skipLibCheck: true,
  },
  files: [tsFile],
}, null, 2));

if (constants.length > 0) {
  try {
    execFileSync(
        process.execPath,
        [require.resolve("typescript/bin/tsc"), "-p", outDir],
        { stdio: "inherit" });
  } catch (e) {
    fail(tsFile, "tsc --strict found the errors above");
  }
}

console.log(`${checked} manifest documents checked in ${files.length} files ` +
            `(schema and strict types), ${failures} failed`);
process.exit(failures === 0 ? 0 : 1);
