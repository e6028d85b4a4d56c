// The package as an app imports it: by name (Node's self-reference through package.json's
// "exports"), each entry with the same names, each name declared in types/ for TypeScript.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const web = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const pkg = JSON.parse(fs.readFileSync(path.join(web, 'package.json'), 'utf8'));

/** The values (not types) a declaration file and the files it re-exports declare. */
function declared(file) {
  const text = fs.readFileSync(path.join(web, file), 'utf8');
  const names = [...text.matchAll(/^export declare (?:const|function|class) (\w+)/gm)].map((m) => m[1]);
  for (const [, from] of text.matchAll(/^export \* from '\.\/(\w+)\.js';/gm)) {
    names.push(...declared(`types/${from}.d.ts`));
  }
  return names;
}

test('the package imports by its name: in Node, its node entry', async () => {
  const byName = await import(pkg.name);
  const node = await import('../src/node.mjs');
  assert.equal(byName.ViT, node.ViT);
  assert.equal(pkg.exports['.'].node.default, './src/node.mjs');
});

test('every entry exports the same names, and its declarations declare exactly those', async () => {
  const conditions = pkg.exports['.'];
  const entries = [
    [conditions.node.default, conditions.node.types],
    [conditions.browser.default, conditions.browser.types],
    [conditions.default, conditions.types],
  ];
  assert.equal(pkg.main, conditions.default.slice(2));
  assert.equal(pkg.types, conditions.types.slice(2));
  const node = Object.keys(await import(path.join(web, conditions.node.default))).sort();
  assert.ok(node.length >= 37, `${node.length} names`);
  for (const [entry, types] of entries) {
    const names = Object.keys(await import(path.join(web, entry))).sort();
    assert.deepEqual(names, node, entry);
    assert.deepEqual(declared(types).sort(), names, `${types} against ${entry}`);
  }
});

test('the package ships what its "exports" name (and no tests)', () => {
  const shipped = (rel) => pkg.files.some((f) => rel === f || rel.startsWith(f.replace(/\*\.d\.ts$/, '')));
  const targets = [];
  (function walk(v) { if (typeof v === 'string') targets.push(v.slice(2)); else Object.values(v).forEach(walk); })(pkg.exports['.']);
  for (const t of targets) {
    assert.ok(fs.existsSync(path.join(web, t)), t);
    assert.ok(shipped(t), `${t} is not under "files"`);
  }
  assert.ok(!pkg.private, 'a package to publish is not private');
  assert.ok(!pkg.files.some((f) => f.startsWith('test')), pkg.files);
});
