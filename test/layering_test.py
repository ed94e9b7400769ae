#!/usr/bin/env python3
"""Checks every #include "..." in the source tree against the rules table of
docs/architecture.md ("Who may include whom"), so the rooms' layering stays true.

  test/layering_test.py SOURCE_DIR

Sources are the files git tracks (every file under SOURCE_DIR when it is not a
git checkout) ending in .cc, .h, .cu, .cuh, .cpp, .hpp or .c. Exits 1, listing
each violation as file:line, when an include is not allowed, when a source
file belongs to no room, when a .cu file includes a Cap'n Proto or KJ header,
or when the table cannot be read.
"""
import fnmatch
import os
import re
import subprocess
import sys

SOURCE_EXTENSIONS = ('.cc', '.h', '.cu', '.cuh', '.cpp', '.hpp', '.c')
BEGIN = '<!-- layering-rules: begin'
END = '<!-- layering-rules: end'
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


class TableError(Exception):
    pass


def cells(line):
    return [c.strip() for c in line.strip().strip('|').split('|')]


def entries(cell):
    """The backquoted entries of a cell: `a`, `b` -> ['a', 'b']."""
    found = re.findall(r'`([^`]+)`', cell)
    rest = re.sub(r'`[^`]+`', '', cell).replace(',', '').strip()
    if rest:
        raise TableError('cell %r: entries must be `backquoted`, separated by commas' % cell)
    return found


def parse_rules(text):
    """Returns [(room, [file entries], [allowed entries])] from the marked table."""
    start = text.find(BEGIN)
    end = text.find(END)
    if start < 0 or end < 0 or end < start:
        raise TableError('no table between "%s" and "%s"' % (BEGIN, END))
    rows = [l for l in text[start:end].splitlines()[1:] if l.strip().startswith('|')]
    if len(rows) < 3 or cells(rows[0])[:3] != ['room', 'its files', 'may include']:
        raise TableError('the table must start with the header | room | its files | may include |')
    rules = []
    for line in rows[2:]:
        row = cells(line)
        if len(row) != 3:
            raise TableError('row %r: want 3 cells, got %d' % (line, len(row)))
        room = entries(row[0])
        if len(room) != 1:
            raise TableError('row %r: the room cell must name one room' % line)
        files = entries(row[1])
        if not files:
            raise TableError('row %r: no files' % line)
        rules.append((room[0], files, entries(row[2])))
    names = [r[0] for r in rules]
    if len(set(names)) != len(names):
        raise TableError('a room is named twice')
    for room, _, allowed in rules:
        for a in allowed:
            if a != '*' and a not in names and '.' not in os.path.basename(a):
                raise TableError('room %s may include %r, which is no room and no file' % (room, a))
    return rules


class Rooms:
    def __init__(self, rules):
        self.rules = rules
        self.exact, self.patterns, self.folders = {}, [], {}
        for room, files, _ in rules:
            for f in files:
                if f.endswith('/'):
                    self.folders[f.rstrip('/')] = room
                elif any(ch in f for ch in '*?['):
                    self.patterns.append((f, room))
                else:
                    self.exact[f] = room
        self.allowed = {room: allowed for room, _, allowed in rules}

    def room_of(self, path):
        """The room a file (a path from the top of the tree) belongs to, or None."""
        if path in self.exact:
            return self.exact[path]
        for pattern, room in self.patterns:
            if fnmatch.fnmatchcase(path, pattern):
                return room
        return self.folders.get(os.path.dirname(path))

    def may_include(self, room, target_path, target_room):
        if target_room == room:
            return True
        allowed = self.allowed[room]
        return '*' in allowed or target_room in allowed or target_path in allowed


def include_path(name):
    """Where an include written as "name" lives, from the top of the tree."""
    return 'include/' + name if name.startswith('ps/') else name


def sources(root):
    try:
        out = subprocess.run(['git', '-C', root, 'ls-files', '-z'], capture_output=True, check=True).stdout
        files = [f for f in out.decode().split('\0') if f and os.path.exists(os.path.join(root, f))]
    except (OSError, subprocess.CalledProcessError):
        files = []
    if not files:  # not a git checkout (a source archive): every file
        for d, subdirs, names in os.walk(root):
            subdirs[:] = [s for s in subdirs if not s.startswith('.') and not s.startswith('build')]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(f for f in files if f.endswith(SOURCE_EXTENSIONS))


def check(root, rules):
    rooms = Rooms(rules)
    problems = []
    files = sources(root)
    if not files:
        return ['%s: no source files found' % root]
    for path in files:
        room = rooms.room_of(path)
        if room is None:
            problems.append('%s: belongs to no room: add its folder to the table in docs/architecture.md' % path)
            continue
        with open(os.path.join(root, path), encoding='utf-8', errors='replace') as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                quote, name = m.groups()
                where = '%s:%d' % (path, number)
                if quote == '<':
                    if path.endswith('.cu') and re.match(r'(capnp|kj)/', name):
                        problems.append('%s: <%s>: .cu files must not include Cap\'n Proto or KJ headers '
                                        '(nvcc cannot compile them)' % (where, name))
                    continue
                target = include_path(name)
                target_room = rooms.room_of(target)
                if target_room is None:
                    problems.append('%s: "%s" is in no room (includes are written from the top of the tree)'
                                    % (where, name))
                elif not rooms.may_include(room, target, target_room):
                    problems.append('%s: "%s": room %s may not include room %s' % (where, name, room, target_room))
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    doc = os.path.join(root, 'docs', 'architecture.md')
    try:
        with open(doc, encoding='utf-8') as f:
            rules = parse_rules(f.read())
    except (OSError, TableError) as e:
        print('layering: cannot read the rules table of %s: %s' % (doc, e))
        return 1
    problems = check(root, rules)
    for p in problems:
        print(p)
    if problems:
        print('layering: %d problem(s); the rules are in docs/architecture.md, "Who may include whom"' % len(problems))
        return 1
    print('layering: %d rooms, every include allowed' % len(rules))
    return 0


if __name__ == '__main__':
    sys.exit(main())
