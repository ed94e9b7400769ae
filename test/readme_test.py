#!/usr/bin/env python3
"""Checks that the commands of README.md and docs/*.md exist: every `scripts/X`,
`build/...` and source-tree Python program named in their shell code (fenced
sh/bash blocks, indented code blocks, and inline code that starts with one, or
with a program's name and a flag: `psd --nice -10`)
must exist and be executable; every --flag written on a command line of a
program that has a --help (psd, the trainers and examples, the benchmarks,
launch_local.sh, the Python tools) must appear in that --help; every test or
suite `meson test -C build` names must be one of the build's; and every --flag
in the first column of the flag tables of docs/operations.md (psd) and
docs/training.md (mnist_trainer) must be in that program's --help.

  test/readme_test.py SOURCE_DIR BUILD_DIR

scripts/ and other source paths are looked up in SOURCE_DIR, build/ programs in
BUILD_DIR (build/bench/ only when the build has -Dbench=true; build-fuzz/ and
what scripts make under build/, such as build/venv-tb, are not checked). Flags
after launch_local.sh's `--` are the trainer's (mnist_trainer, or the one its
--trainer names). Python programs' --help runs with the interpreter the build
is for (-Dpython) and PYTHONPATH=BUILD_DIR/python; one that cannot import what
it needs there (PyTorch, NumPy) has its flags skipped. Exits 1, listing each
problem, when anything is missing.
"""
import glob
import json
import os
import re
import shlex
import subprocess
import sys

SHELL_BLOCKS = ('sh', 'bash', 'shell', 'console')
# Programs whose --help lists their flags and has no side effects (scripts such as
# demo.sh or get_data.sh take no --help: they would run).
WITH_HELP = ('psd', 'mnist_trainer', 'linreg_trainer', 'hello_cluster', 'hello_push_pull',
             'ctr_trainer', 'make_ctr_data', 'launch_local.sh', 'cluster_status.py',
             'check_events.py', 'embedding_bench', 'push_pull_bench', 'load_bench', 'apply_bench',
             'attack_soak', 'mlp_bench', 'python_bench.py', 'torch_mnist.py', 'torch_ctr.py')
# Inline code that starts with one of these names and writes a flag (`psd --nice -10`) is a
# command of that program too.
PROGRAM_PATHS = {'psd': 'build/server/psd', 'mnist_trainer': 'build/examples/mnist_trainer',
                 'linreg_trainer': 'build/examples/linreg_trainer', 'hello_cluster': 'build/examples/hello_cluster',
                 'hello_push_pull': 'build/examples/hello_push_pull', 'ctr_trainer': 'build/examples/ctr_trainer',
                 'make_ctr_data': 'build/examples/make_ctr_data', 'embedding_bench': 'build/bench/embedding_bench',
                 'push_pull_bench': 'build/bench/push_pull_bench', 'load_bench': 'build/bench/load_bench',
                 'apply_bench': 'build/bench/apply_bench', 'attack_soak': 'build/bench/attack_soak',
                 'mlp_bench': 'build/bench/mlp_bench', 'launch_local.sh': 'scripts/launch_local.sh',
                 'cluster_status.py': 'scripts/cluster_status.py', 'check_events.py': 'scripts/check_events.py',
                 'python_bench.py': 'bench/python_bench.py', 'torch_mnist.py': 'examples/python/torch_mnist.py',
                 'torch_ctr.py': 'examples/python/torch_ctr.py'}
SEPARATORS = ('&&', '||', '|', ';', '&', '(', ')')
ASSIGNMENT = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*=')
REDIRECTION = re.compile(r'\d*>&\d+|\d*>>?\s*\S+|<\s*\S+')
SOURCE_PROGRAM = re.compile(r'^(scripts|bench|examples|test|fuzz)/\S+$')
# Made by a script, not by the build (scripts/tensorboard_venv.sh).
MADE_BY_SCRIPTS = ('build/venv-tb',)
# The flag tables: page -> the program whose --help has every flag of their first column.
FLAG_TABLES = {'docs/operations.md': 'build/server/psd', 'docs/training.md': 'build/examples/mnist_trainer'}
MESON_TEST_VALUE_OPTIONS = ('-C', '--suite', '--no-suite', '--setup', '--wrapper', '--num-processes',
                            '--repeat', '--maxfail', '--timeout-multiplier', '--logbase', '--test-args',
                            '--gdb-path')


def command_lines(text):
    """(line number, text, kind) of every command line in shell blocks (kind True:
    it must parse as shell), indented code blocks (False: they may hold Python or
    output) and inline code that starts with scripts/ or build/ ('inline': one
    word alone names a file, which must exist, not necessarily a program)."""
    out, block, previous_blank, indented = [], None, True, False
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r'^\s*```\s*(\S*)', line)
        if fence:
            block = None if block is not None else fence.group(1).lower()
            indented = False
            continue
        if block is not None:
            if block in SHELL_BLOCKS:
                out.append((number, line, True))
            previous_blank = not line.strip()
            continue
        if line.startswith('    ') and (indented or previous_blank) and line.strip():
            indented = True
            body = line.strip()
            if body.startswith('$ '):
                body = body[2:]
            out.append((number, body, False))
            continue
        if line.strip():
            indented = False
        previous_blank = not line.strip()
        for span in re.findall(r'`([^`]+)`', line):
            if re.match(r'(scripts|build)/\S*[^/\s]( |$)', span):
                out.append((number, span, 'inline'))
            elif span.split(' ', 1)[0] in PROGRAM_PATHS and ' --' in span or span.startswith('meson test '):
                out.append((number, span, 'inline'))
    # Lines ending in a backslash go on on the next one, and so do quotes left open.
    joined = []
    for number, line, kind in out:
        if joined and joined[-1][1].endswith('\\'):
            joined[-1] = (joined[-1][0], joined[-1][1][:-1] + ' ' + line, joined[-1][2])
        elif joined and joined[-1][2] is True and kind is True and open_quote(joined[-1][1]):
            joined[-1] = (joined[-1][0], joined[-1][1] + '\n' + line, True)
        else:
            joined.append((number, line, kind))
    return joined


def open_quote(line):
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = '#'
        list(lexer)
        return False
    except ValueError:
        return True


def commands(lines, problems, page):
    """(line number, [words], named) of every simple command, with variables set
    by earlier assignment lines (X=value) expanded; named: an inline path alone."""
    variables, result = {}, []
    for number, text, kind in lines:
        text = re.sub(r'\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?', lambda m: variables.get(m.group(1), m.group(0)), text)
        text = REDIRECTION.sub(' ', text)
        lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = '#'
        try:
            words = list(lexer)
        except ValueError as e:
            if kind is not False:
                problems.append('%s:%d: cannot parse as shell (%s)' % (page, number, e))
            continue
        current = []
        for word in words + [';']:
            if word in SEPARATORS:
                if current:
                    if all(ASSIGNMENT.match(w) for w in current):
                        for w in current:
                            name, value = w.split('=', 1)
                            variables[name] = shlex.quote(value) if ' ' not in value else value
                    else:
                        while current and ASSIGNMENT.match(current[0]):
                            current.pop(0)  # VAR=value before a command: its environment
                        if current:
                            result.append((number, current, kind == 'inline' and len(words) == 1))
                current = []
            else:
                current.append(word)
    return result


def build_option(build, name):
    try:
        with open(os.path.join(build, 'meson-info', 'intro-buildoptions.json')) as f:
            for option in json.load(f):
                if option['name'] == name:
                    return option['value']
    except (OSError, ValueError):
        pass
    return None


def meson_tests(source, build):
    """Names and suites (with and without the project prefix) of the build's tests, and
    of those the meson.build files declare (a CUDA test exists only where nvcc is)."""
    try:
        with open(os.path.join(build, 'meson-info', 'intro-tests.json')) as f:
            tests = json.load(f)
    except (OSError, ValueError):
        return None
    names = set()
    for path in glob.glob(os.path.join(source, '**', 'meson.build'), recursive=True):
        with open(path, encoding='utf-8') as f:
            text = f.read()
        names.update(re.findall(r"\btest\(\s*'([^']+)'", text))
        names.update(re.findall(r"suite:\s*'([^']+)'", text))
    for t in tests:
        names.add(t['name'])
        for s in t['suite']:
            names.add(s)
            names.add(s.split(':', 1)[-1])
    return names


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    source, build = sys.argv[1], sys.argv[2]
    python = build_option(build, 'python') or sys.executable
    bench_built = build_option(build, 'bench') is not False
    tests = meson_tests(source, build)
    pages = ['README.md'] + sorted(os.path.relpath(p, source) for p in glob.glob(os.path.join(source, 'docs', '*.md')))
    problems, skipped = [], set()
    counts = {'commands': 0, 'flags': 0, 'tests': 0}
    programs = set()
    help_cache = {}

    def resolve(program):
        if program.startswith(MADE_BY_SCRIPTS) or program.startswith('build-'):
            return None
        if program.startswith('build/bench/') and not bench_built:
            return None
        if program.startswith('build/'):
            return os.path.join(build, program[len('build/'):])
        if SOURCE_PROGRAM.match(program):
            return os.path.join(source, program)
        return None

    def help_text(path):
        if path not in help_cache:
            argv = [python, path, '--help'] if path.endswith('.py') else [path, '--help']
            env = dict(os.environ, PYTHONPATH=os.path.join(build, 'python'))
            try:
                p = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)
                out = p.stdout + p.stderr
                if 'ModuleNotFoundError' in out or 'ImportError' in out:
                    help_cache[path] = 'skip'
                elif p.returncode == 0 or re.match(r'usage:', out, re.I):
                    help_cache[path] = out
                else:
                    help_cache[path] = None
            except (OSError, subprocess.TimeoutExpired):
                help_cache[path] = None
        return help_cache[path]

    def check_flags(where, program, path, words):
        text = help_text(path)
        if text == 'skip':
            skipped.add(program)
            return
        if text is None:
            problems.append('%s: %s --help failed' % (where, program))
            return
        for w in words:
            if not w.startswith('--') or w == '--':
                continue
            flag = w.split('=', 1)[0]
            counts['flags'] += 1
            if not re.search(r'(?<![\w-])%s(?![\w-])' % re.escape(flag), text):
                problems.append('%s: %s has no %s (not in its --help)' % (where, program, flag))

    def check_command(where, words):
        if words[0] in ('python3', '/usr/bin/python3') and len(words) > 1 and words[1].endswith('.py'):
            words = words[1:]
        if words[:2] == ['meson', 'test'] and tests is not None:
            args, i = words[2:], 0
            while i < len(args):
                a = args[i]
                if a in ('--suite', '--no-suite') and i + 1 < len(args):
                    counts['tests'] += 1
                    if args[i + 1] not in tests:
                        problems.append('%s: meson test: no suite %s' % (where, args[i + 1]))
                if a in MESON_TEST_VALUE_OPTIONS:
                    i += 2
                    continue
                if not a.startswith('-'):
                    counts['tests'] += 1
                    if a not in tests:
                        problems.append('%s: meson test: no test or suite %s' % (where, a))
                i += 1
            return
        program = words[0]
        if program in PROGRAM_PATHS:
            program = PROGRAM_PATHS[program]
        path = resolve(program)
        if path is None:
            return
        counts['commands'] += 1
        programs.add(program)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            problems.append('%s: %s does not exist (or is not executable) at %s' % (where, program, path))
            return
        name = os.path.basename(program)
        if name not in WITH_HELP:
            return
        args = words[1:]
        if name == 'launch_local.sh':
            own, trainer_args = (args[:args.index('--')], args[args.index('--') + 1:]) if '--' in args else (args, [])
            # Values of options are not flags: --psd_flags "--nice -10" is one word.
            check_flags(where, program, path, own)
            trainer = 'build/examples/mnist_trainer'
            for i, w in enumerate(own):
                if w == '--trainer' and i + 1 < len(own):
                    trainer = own[i + 1]
                elif w.startswith('--trainer='):
                    trainer = w.split('=', 1)[1]
            trainer_path = resolve(trainer)
            if trainer_path is None or not os.path.isfile(trainer_path):
                problems.append('%s: trainer %s not found' % (where, trainer))
            elif trainer_args:
                check_flags(where, trainer, trainer_path, trainer_args)
        else:
            check_flags(where, program, path, args)

    for page in pages:
        with open(os.path.join(source, page), encoding='utf-8') as f:
            text = f.read()
        for number, words, named in commands(command_lines(text), problems, page):
            if named:  # `scripts/deploy/Dockerfile`: a file that must exist
                path = resolve(words[0])
                if path is not None and not os.path.exists(path):
                    problems.append('%s:%d: %s does not exist' % (page, number, words[0]))
                continue
            check_command('%s:%d' % (page, number), words)
        if page in FLAG_TABLES:
            program = FLAG_TABLES[page]
            path = resolve(program)
            in_table = False
            for number, line in enumerate(text.splitlines(), 1):
                cells = [c.strip() for c in re.split(r'(?<!\\)\|', line.strip())[1:-1]] if line.startswith('|') else []
                if not cells:
                    in_table = False
                    continue
                if cells[0] == 'flag':
                    in_table = True
                    continue
                if in_table:
                    flags = re.findall(r'(?<![\w-])--[a-z][a-z0-9_]*', cells[0])
                    check_flags('%s:%d' % (page, number), program, path, flags)

    for p in problems:
        print(p)
    if not programs:
        print('readme: found no scripts/ or build/ commands in README.md and docs/')
        return 1
    if problems:
        print('readme: %d problem(s)' % len(problems))
        return 1
    print('readme: %d pages, %d commands (%d programs), %d flags, %d meson test names, all present%s'
          % (len(pages), counts['commands'], len(programs), counts['flags'], counts['tests'],
             '; flags not checked (cannot import what it needs): ' + ', '.join(sorted(skipped)) if skipped else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
