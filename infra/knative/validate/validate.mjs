// Validate spotguard's Knative objects against the Knative CRD schemas of
// @kubernetes-models/knative: `new Service(obj).validate()` and the like.
//
//   node validate.mjs [FILE...]     (default: every ../*.yaml)
//
// Objects of a *.knative.dev API group are validated; a Knative kind or
// version this package does not know is an error. Other objects (core
// Kubernetes) are counted and left to kubernetes-validate. Exit status 1 on
// any problem.
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import yaml from "js-yaml";

const here = dirname(fileURLToPath(import.meta.url));

function defaultFiles() {
  const dir = resolve(here, "..");
  return readdirSync(dir)
    .filter((name) => name.endsWith(".yaml") && name !== "kustomization.yaml")
    .sort()
    .map((name) => join(dir, name));
}

async function modelFor(apiVersion, kind) {
  const [group, version] = apiVersion.split("/");
  let mod;
  try {
    mod = await import(`@kubernetes-models/knative/${group}/${version}`);
  } catch (err) {
    return { error: `unknown Knative API version ${apiVersion} (${err.code || err.message})` };
  }
  const Model = mod[kind];
  if (typeof Model !== "function") {
    return { error: `unknown Knative kind ${kind} in ${apiVersion}` };
  }
  return { Model };
}

function describe(err) {
  if (Array.isArray(err.errors)) {
    return err.errors
      .map((e) => `${e.instancePath || "/"} ${e.message || e.keyword}${e.params ? " " + JSON.stringify(e.params) : ""}`)
      .join("; ");
  }
  return err.message;
}

async function main() {
  const files = process.argv.length > 2 ? process.argv.slice(2) : defaultFiles();
  let checked = 0;
  let skipped = 0;
  const problems = [];
  for (const file of files) {
    let docs;
    try {
      docs = yaml.loadAll(readFileSync(file, "utf8"));
    } catch (err) {
      problems.push(`${file}: cannot parse YAML: ${err.message}`);
      continue;
    }
    for (const obj of docs) {
      if (obj === null || obj === undefined) continue;
      const where = `${file}: ${obj.kind || "?"} ${obj.metadata?.name || "?"}`;
      if (typeof obj !== "object" || typeof obj.apiVersion !== "string" || typeof obj.kind !== "string") {
        problems.push(`${where}: not a Kubernetes object (apiVersion and kind are required)`);
        continue;
      }
      const group = obj.apiVersion.includes("/") ? obj.apiVersion.split("/")[0] : "";
      if (!group.endsWith("knative.dev")) {
        skipped += 1;
        continue;
      }
      const { Model, error } = await modelFor(obj.apiVersion, obj.kind);
      if (error) {
        problems.push(`${where}: ${error}`);
        continue;
      }
      try {
        new Model(obj).validate();
        checked += 1;
        console.log(`knative-validate: ok ${obj.apiVersion} ${obj.kind} ${obj.metadata?.name}`);
      } catch (err) {
        problems.push(`${where}: ${describe(err)}`);
      }
    }
  }
  for (const problem of problems) console.error(`knative-validate: FAIL ${problem}`);
  console.log(
    `knative-validate: ${checked} Knative objects valid, ${problems.length} problems, ` +
      `${skipped} non-Knative objects left to kubernetes-validate (${files.length} files)`,
  );
  if (checked === 0 && problems.length === 0) {
    console.error("knative-validate: FAIL no Knative object found");
    process.exit(1);
  }
  process.exit(problems.length ? 1 : 0);
}

await main();
