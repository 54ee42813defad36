// Validate custom resources against the JSON schemas of their CRDs: those packaged by
// kubernetes-models (@kubernetes-models/prometheus-operator, @kubernetes-models/keda,
// @kubernetes-models/gateway-api), and the InferencePool of the Gateway API Inference
// Extension, which no npm package carries: inferencepool-v1.schema.json beside this file
// (from the extension's v1 CRD, see its $comment), checked with ajv.
// stdin: a JSON array of objects. stdout: one "ok KIND/NAME" or "FAIL KIND/NAME: why" line
// each. Exit status 1 when any object fails or has no known schema.
//   npm ci --prefix deploy/crd-schemas && node deploy/crd-schemas/validate-crds.mjs < objs.json
import { readFileSync } from "node:fs";
import Ajv from "ajv";

const MODELS = {
  "monitoring.coreos.com/v1/ServiceMonitor":
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor",
  "monitoring.coreos.com/v1/PrometheusRule":
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule",
  "keda.sh/v1alpha1/ScaledObject": "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject",
  "gateway.networking.k8s.io/v1/HTTPRoute":
    "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/HTTPRoute",
};
const SCHEMAS = {
  "inference.networking.k8s.io/v1/InferencePool": "inferencepool-v1.schema.json",
};

const ajv = new Ajv({ allErrors: true, strict: false });

async function validate(key, obj) {
  if (MODELS[key]) {
    const Model = (await import(MODELS[key]))[obj.kind];
    new Model(obj).validate();
    return;
  }
  const url = new URL(SCHEMAS[key], import.meta.url);
  const check = ajv.compile(JSON.parse(readFileSync(url, "utf8")));
  if (!check(obj)) {
    throw new Error(check.errors.map((e) => `${e.instancePath || "/"} ${e.message}` +
      (e.params?.additionalProperty ? ` (${e.params.additionalProperty})` : "")).join("; "));
  }
}

let failed = false;
for (const obj of JSON.parse(readFileSync(0, "utf8"))) {
  const key = `${obj.apiVersion}/${obj.kind}`;
  const name = `${obj.kind}/${obj.metadata?.name}`;
  if (!MODELS[key] && !SCHEMAS[key]) {
    console.log(`FAIL ${name}: no schema for ${key}`);
    failed = true;
    continue;
  }
  try {
    await validate(key, obj);
    console.log(`ok ${name}`);
  } catch (err) {
    console.log(`FAIL ${name}: ${err.message}`);
    failed = true;
  }
}
process.exit(failed ? 1 : 0);
