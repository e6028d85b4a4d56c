// Loaded before every test file (package.json's test script: node --import): the tests
// import onnxruntime-node themselves, and its native library keeps a telemetry event store
// under ~/.cache/Microsoft/DeveloperTools/ unless ORT_DISABLE_TELEMETRY is set when it loads.
// The package's own loader sets it (src/lib/platform-node.mjs quietOrt); the tests too, so
// `npm test` writes nothing into the home folder.
import { quietOrt } from '../src/lib/platform-node.mjs';

quietOrt(process.env);
