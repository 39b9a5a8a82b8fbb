// Validates the cert-manager.io/v1 and monitoring.coreos.com/v1 objects of a
// rendered manifest with @kubernetes-models' validators, which are compiled
// from those projects' CRD schemas (required fields, types, enums, patterns).
// usage: IC_CRD_MODELS=<node_modules> node validate-custom-resources.mjs FILE
// Prints "ERROR <kind>/<name>: ..." per invalid object and "checked N";
// exits 1 when any object is invalid or of a kind it has no validator for.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const models = process.env.IC_CRD_MODELS;
if (!models) {
  console.error("IC_CRD_MODELS must name the node_modules holding @kubernetes-models");
  process.exit(2);
}
// ES module resolution starts from this file, not from IC_CRD_MODELS: read
// each package's export map and import the file it names.
const load = async (pkg, subpath = ".") => {
  const dir = join(models, pkg);
  const entry = JSON.parse(readFileSync(join(dir, "package.json"), "utf8")).exports[subpath];
  const file = typeof entry === "string" ? entry : entry.import ?? entry.node ?? entry.default;
  return import(pathToFileURL(join(dir, file)).href);
};
const { parseAllDocuments } = await load("yaml");
const groups = {
  "cert-manager.io/v1": await load("@kubernetes-models/cert-manager", "./cert-manager.io/v1"),
  "monitoring.coreos.com/v1": await load("@kubernetes-models/prometheus-operator", "./monitoring.coreos.com/v1"),
};
let failed = false;
let checked = 0;
for (const doc of parseAllDocuments(readFileSync(process.argv[2], "utf8"))) {
  const o = doc.toJS();
  if (!o || !(o.apiVersion in groups)) continue;
  const Model = groups[o.apiVersion][o.kind];
  const id = `${o.kind}/${o.metadata?.name}`;
  if (!Model) {
    failed = true;
    console.log(`ERROR ${id}: no validator for ${o.apiVersion} ${o.kind}`);
    continue;
  }
  checked += 1;
  try {
    new Model(o).validate();
  } catch (e) {
    failed = true;
    console.log(`ERROR ${id}: ${String(e.message).replace(/\n/g, "; ")}`);
  }
}
console.log(`checked ${checked}`);
process.exit(failed ? 1 : 0);
