import CofferTestSupport
import Foundation

/// The attacker's hand on a container's store, for the tamper suites (IntegrityTests,
/// HostileContainerTests), on either engine: python3's sqlite3 on a directory's `store.db`, or psql
/// as the server's superuser on a PostgreSQL container's schema (the attacker is the server).
enum TamperStore {
    /// Python that defines `connect(target)`: a sqlite3 connection to a `store.db` path, or for a
    /// container URI an object with the same few calls (`execute` with `?` parameters, `fetchone`,
    /// `fetchall`, `rowcount`, `commit`) that runs each statement through psql with the container's
    /// schema as search_path. `ATTACH DATABASE ? AS name` with a schema's name makes `name.table`
    /// that schema's table, as SQLite's ATTACH does for an older copy's file. `DatabaseError`
    /// catches either engine's refusal; `is_postgres(target)` tells them apart.
    static let python = #"""
        import csv, io, json, os, random, re, sqlite3, subprocess, sys

        class PsqlError(Exception): pass

        class _Rows:
            def __init__(self, rows, rowcount): self.rows, self.rowcount = rows, rowcount
            def fetchone(self): return self.rows[0] if self.rows else None
            def fetchall(self): return list(self.rows)

        class Psql:
            def __init__(self, uri):
                base, _, query = uri.partition('?')
                params = [p for p in query.split('&') if p]
                self.schema = next((p[len('container='):] for p in params if p.startswith('container=')), 'coffer')
                rest = [p for p in params if not p.startswith('container=')]
                self.conninfo = base + ('?' + '&'.join(rest) if rest else '')
                self.attached = {}

            @staticmethod
            def literal(v):
                if v is None: return 'NULL'
                if isinstance(v, (bytes, bytearray, memoryview)): return "'\\x%s'::bytea" % bytes(v).hex()
                if isinstance(v, bool): return 'true' if v else 'false'
                if isinstance(v, int): return str(v)
                return "'%s'" % str(v).replace("'", "''")

            @staticmethod
            def value(text):
                if text.startswith('\\x'): return bytes.fromhex(text[2:])
                if re.fullmatch(r'-?[0-9]+', text): return int(text)
                return text

            def execute(self, sql, args=()):
                m = re.fullmatch(r'\s*ATTACH DATABASE \? AS (\w+)\s*', sql, re.I)
                if m:
                    self.attached[m.group(1)] = args[0]
                    return _Rows([], 0)
                pieces = sql.split('?')
                if len(pieces) != len(args) + 1: raise PsqlError('%d parameters for %r' % (len(args), sql))
                text = pieces[0] + ''.join(self.literal(a) + p for a, p in zip(args, pieces[1:]))
                for name, schema in self.attached.items():
                    text = re.sub(r'\b%s\.' % name, '"%s".' % schema, text)
                env = dict(os.environ, PGOPTIONS='-c search_path="%s"' % self.schema)
                r = subprocess.run(['psql', '-X', '-A', '-t', '--csv', '-v', 'ON_ERROR_STOP=1', '-d', self.conninfo, '-f', '-'],
                                   input=text, env=env, capture_output=True, text=True, timeout=120)
                if r.returncode != 0: raise PsqlError(r.stderr.strip())
                tag = re.fullmatch(r'(?:INSERT 0|UPDATE|DELETE) ([0-9]+)\n?', r.stdout)
                if tag: return _Rows([], int(tag.group(1)))
                if re.match(r'\s*(SELECT|WITH)\b', text, re.I):
                    return _Rows([tuple(Psql.value(c) for c in row) for row in csv.reader(io.StringIO(r.stdout))], -1)
                return _Rows([], -1)

            def commit(self): pass
            def close(self): pass

        def is_postgres(target): return target.startswith(('postgresql://', 'postgres://'))

        def inline_segments(db, path):
            """Puts every chunk a row names in a segment file back into its row (a layout the format
            allows), so the attacks on rows below reach chunk bytes; segments have their own tests."""
            try:
                if 'seg' not in [r[1] for r in db.execute('PRAGMA table_info(chunks)').fetchall()]: return
                seg_dir = os.path.join(os.path.dirname(path), 'segments')
                for file, idx, seg, off, ln in db.execute('SELECT file, idx, seg, off, len FROM chunks WHERE seg IS NOT NULL').fetchall():
                    try:
                        with open(os.path.join(seg_dir, str(seg)), 'rb') as f:
                            f.seek(off)
                            v = f.read(ln)
                    except (OSError, ValueError, TypeError):
                        continue
                    db.execute('UPDATE chunks SET value = ?, seg = NULL, off = NULL, len = NULL WHERE file = ? AND idx = ?', (v, file, idx))
                db.commit()
            except sqlite3.DatabaseError:
                pass  # a store an earlier attack already broke: attacked as it is

        def connect(target):
            if is_postgres(target): return Psql(target)
            db = sqlite3.connect(target)
            inline_segments(db, target)
            return db
        DatabaseError = (sqlite3.DatabaseError, PsqlError)

        """#

    /// What `connect` takes for a container: its `store.db`, or its URI.
    static func target(_ container: String) -> String {
        TestEngine.isURI(container) ? container : container + "/store.db"
    }

    /// The schema of a container URI (its `container=` parameter).
    static func schema(_ uri: String) -> String {
        let query = uri.split(separator: "?", maxSplits: 1).last ?? ""
        let param = query.split(separator: "&").first { $0.hasPrefix("container=") }
        return param.map { String($0.dropFirst("container=".count)) } ?? "coffer"
    }

    /// The URI of container `schema` in the test cluster.
    static func uri(schema: String) throws -> String { try TestEngine.cluster().superuserURI + "&container=" + schema }

    /// Copies every table of schema `from` (rows, keys, storage) into a new schema `to`: the
    /// attacker's older copy of a container, or a container's copy for one fuzz seed.
    static func copySchema(from: String, to: String) throws {
        try TestEngine.cluster().psql(
            """
            DO $$ DECLARE t text; BEGIN
                EXECUTE format('CREATE SCHEMA %I', '\(to)');
                FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = '\(from)' LOOP
                    EXECUTE format('CREATE TABLE %I.%I (LIKE %I.%I INCLUDING ALL)', '\(to)', t, '\(from)', t);
                    EXECUTE format('INSERT INTO %I.%I SELECT * FROM %I.%I', '\(to)', t, '\(from)', t);
                END LOOP;
            END $$
            """)
        let copied = try TestEngine.cluster().psql("SELECT count(*) FROM pg_tables WHERE schemaname = '\(to)'")
        guard let n = Int(copied.trimmingCharacters(in: .whitespacesAndNewlines)), n >= 9 else {
            throw Sandbox.SandboxError("copying schema \(from) to \(to) made \(copied) tables")
        }
    }

    /// Drops a schema made by `copySchema` (a leftover would only cost space in the test cluster).
    static func dropSchema(_ name: String) {
        _ = try? TestEngine.cluster().psql("SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS \"\(name)\" CASCADE")
    }
}
