// Validate custom resources against the JSON schemas of their CRDs, as packaged by
// kubernetes-models (@kubernetes-models/prometheus-operator, @kubernetes-models/keda).
// stdin: a JSON array of objects. stdout: one "ok KIND/NAME" or "FAIL KIND/NAME: why" line
// each. Exit status 1 when any object fails or has no known schema.
//   npm ci --prefix deploy/crd-schemas && node deploy/crd-schemas/validate-crds.mjs < objs.json
import { readFileSync } from "node:fs";

const MODELS = {
  "monitoring.coreos.com/v1/ServiceMonitor":
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor",
  "monitoring.coreos.com/v1/PrometheusRule":
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule",
  "keda.sh/v1alpha1/ScaledObject": "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject",
};

let failed = false;
for (const obj of JSON.parse(readFileSync(0, "utf8"))) {
  const key = `${obj.apiVersion}/${obj.kind}`;
  const name = `${obj.kind}/${obj.metadata?.name}`;
  const path = MODELS[key];
  if (!path) {
    console.log(`FAIL ${name}: no schema for ${key}`);
    failed = true;
    continue;
  }
  const Model = (await import(path))[obj.kind];
  try {
    new Model(obj).validate();
    console.log(`ok ${name}`);
  } catch (err) {
    console.log(`FAIL ${name}: ${err.message}`);
    failed = true;
  }
}
process.exit(failed ? 1 : 0);
