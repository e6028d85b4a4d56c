// The reference numbers the tests compare against, written by Python (tests/website/test_web.py):
// VIT_DEPLOY_WEB_FIXTURES names a directory pytest filled; without it they are written
// now, into a temporary directory, with the repository's .venv (or VIT_DEPLOY_PYTHON).
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const IMAGES = path.join(root, 'tests', 'data', 'web');

function fixturesDir() {
  if (process.env.VIT_DEPLOY_WEB_FIXTURES) return process.env.VIT_DEPLOY_WEB_FIXTURES;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vit-deploy-web-'));
  const python = process.env.VIT_DEPLOY_PYTHON ?? path.join(root, '.venv', 'bin', 'python');
  // tests/ on the path: the script imports the suite's helpers (web_node.py), as pytest does
  const env = { ...process.env, PYTHONPATH: [path.join(root, 'tests'), process.env.PYTHONPATH]
    .filter(Boolean).join(path.delimiter) };
  const r = spawnSync(python, [path.join(root, 'tests', 'website', 'test_web.py'), dir],
    { stdio: 'inherit', env });
  if (r.status !== 0) throw new Error(`${python} tests/website/test_web.py ${dir} failed (${r.status ?? r.error})`);
  process.env.VIT_DEPLOY_WEB_FIXTURES = dir; // one build for every test file of this run
  return dir;
}

export const DIR = fixturesDir();
export const index = JSON.parse(fs.readFileSync(path.join(DIR, 'index.json'), 'utf8'));
export const f32 = (name) => {
  const b = fs.readFileSync(path.join(DIR, name));
  return new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4);
};

export function cosine(a, b) {
  let ab = 0; let aa = 0; let bb = 0;
  for (let i = 0; i < a.length; i++) { ab += a[i] * b[i]; aa += a[i] * a[i]; bb += b[i] * b[i]; }
  return ab / Math.sqrt(aa * bb);
}

export function maxAbs(a, b) {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}
