// Validates an AsyncAPI document with the AsyncAPI initiative's own parser
// (@asyncapi/parser), not with our code: exit 0 when it parses without errors, 1 when
// it has errors (each printed with its path), 2 on bad input.
//
//   npm install --ignore-scripts @asyncapi/parser@3   (in a scratch directory)
//   NODE_PATH=<scratch>/node_modules node tests/interop/asyncapi_validate.js asyncapi.json
const fs = require("fs");
const { Parser, DiagnosticSeverity } = require("@asyncapi/parser");

(async () => {
  const file = process.argv[2];
  if (!file) {
    console.error("usage: asyncapi_validate.js FILE");
    process.exit(2);
  }
  let text;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (e) {
    console.error(`${file}: ${e.message}`);
    process.exit(2);
  }
  const { document, diagnostics } = await new Parser().parse(text);
  const errors = diagnostics.filter((d) => d.severity === DiagnosticSeverity.Error);
  for (const d of diagnostics) {
    console.log(`${["error", "warning", "information", "hint"][d.severity]} ${d.code} ${JSON.stringify(d.path)}: ${d.message}`);
  }
  const version = require("@asyncapi/parser/package.json").version;
  console.log(`@asyncapi/parser ${version}: ${errors.length} error(s), ${diagnostics.length - errors.length} other diagnostic(s)`);
  process.exit(document && errors.length === 0 ? 0 : 1);
})();
