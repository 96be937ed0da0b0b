// Validates Kubernetes objects offline against the API schemas of the kubernetes-models
// package (and prometheus-operator's for PodMonitor). Reads a JSON array of objects on stdin
// (validate-k8s.sh renders the overlays and converts them); prints one line per object and
// exits 1 if any object is invalid or of a kind without a schema here.
import { readFileSync } from "node:fs";

const objects = JSON.parse(readFileSync(0, "utf8"));
let failures = 0;

async function modelOf(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  const candidates = group === "monitoring.coreos.com"
    ? [`@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`]
    : [group === "" ? `kubernetes-models/${version}/${kind}` : `kubernetes-models/${group}/${version}/${kind}`];
  for (const path of candidates) {
    try {
      const module = await import(path);
      return module[kind];
    } catch (error) {
      if (error.code !== "ERR_MODULE_NOT_FOUND" && error.code !== "ERR_PACKAGE_PATH_NOT_EXPORTED") {
        throw error;
      }
    }
  }
  return undefined;
}

for (const object of objects) {
  const name = `${object.kind}/${object.metadata?.name}`;
  const Model = await modelOf(object.apiVersion, object.kind);
  if (Model === undefined) {
    console.log(`FAIL ${name}: no schema for ${object.apiVersion} ${object.kind}`);
    failures++;
    continue;
  }
  try {
    new Model(object).validate();
    console.log(`ok   ${name}`);
  } catch (error) {
    console.log(`FAIL ${name}: ${error.message}`);
    failures++;
  }
}
console.log(`${objects.length - failures} valid, ${failures} invalid`);
process.exit(failures === 0 ? 0 : 1);
