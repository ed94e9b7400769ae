#!/usr/bin/env python3
"""Checks that README.md's commands exist: every `scripts/X` and `build/...` program
named in its shell code blocks (and in inline code that starts with one) must exist
and be executable, and every --flag written on a command line of psd, mnist_trainer,
linreg_trainer or launch_local.sh must appear in that program's --help.

  test/readme_test.py SOURCE_DIR BUILD_DIR

scripts/ programs are looked up in SOURCE_DIR, build/ programs in BUILD_DIR (the
built psd and trainers give their --help). Flags after launch_local.sh's `--` are
the trainer's (mnist_trainer, or the one its --trainer names). Exits 1, listing
each problem, when anything is missing.
"""
import os
import re
import shlex
import subprocess
import sys

SHELL_BLOCKS = ('sh', 'bash', 'shell', 'console')
CHECKED = ('psd', 'mnist_trainer', 'linreg_trainer', 'launch_local.sh')
SEPARATORS = ('&&', '||', '|', ';', '&', '(', ')')
ASSIGNMENT = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*=')
REDIRECTION = re.compile(r'\d*>&\d+|\d*>>?\s*\S+|<\s*\S+')


def command_lines(readme):
    """(line number, text) of every command line in shell blocks and of inline
    code that starts with scripts/ or build/."""
    out, block, start = [], None, 0
    for number, line in enumerate(readme.splitlines(), 1):
        fence = re.match(r'^\s*```\s*(\S*)', line)
        if fence:
            block = None if block is not None else fence.group(1).lower()
            continue
        if block is not None:
            if block in SHELL_BLOCKS:
                out.append((number, line))
            continue
        for span in re.findall(r'`([^`]+)`', line):
            if re.match(r'(scripts|build)/\S*[^/\s]( |$)', span):
                out.append((number, span))
    # Lines ending in a backslash go on on the next one.
    joined = []
    for number, text in out:
        if joined and joined[-1][1].endswith('\\'):
            joined[-1] = (joined[-1][0], joined[-1][1][:-1] + ' ' + text)
        else:
            joined.append((number, text))
    return joined


def commands(lines):
    """(line number, [words]) of every simple command, with variables set by
    earlier assignment lines (X=value) expanded."""
    variables, result = {}, []
    for number, text in lines:
        text = re.sub(r'\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?', lambda m: variables.get(m.group(1), m.group(0)), text)
        text = REDIRECTION.sub(' ', text)
        lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = '#'
        current = []
        for word in list(lexer) + [';']:
            if word in SEPARATORS:
                if current:
                    if all(ASSIGNMENT.match(w) for w in current):
                        for w in current:
                            name, value = w.split('=', 1)
                            variables[name] = shlex.quote(value) if ' ' not in value else value
                    else:
                        while current and ASSIGNMENT.match(current[0]):
                            current.pop(0)  # VAR=value before a command: its environment
                        result.append((number, current))
                current = []
            else:
                current.append(word)
    return result


def help_text(path, cache={}):
    if path not in cache:
        try:
            p = subprocess.run([path, '--help'], capture_output=True, text=True, timeout=30)
            cache[path] = p.stdout + p.stderr if p.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            cache[path] = None
    return cache[path]


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    source, build = sys.argv[1], sys.argv[2]
    with open(os.path.join(source, 'README.md'), encoding='utf-8') as f:
        readme = f.read()
    found = commands(command_lines(readme))
    problems, checked_flags, programs = [], 0, set()

    def resolve(program):
        if program.startswith('scripts/'):
            return os.path.join(source, program)
        if program.startswith('build/'):
            return os.path.join(build, program[len('build/'):])
        return None

    def check_flags(number, program, path, words):
        nonlocal checked_flags
        text = help_text(path)
        if text is None:
            problems.append('README.md:%d: %s --help failed' % (number, program))
            return
        for w in words:
            if not w.startswith('--') or w == '--':
                continue
            flag = w.split('=', 1)[0]
            checked_flags += 1
            if not re.search(r'(?<![\w-])%s(?![\w-])' % re.escape(flag), text):
                problems.append('README.md:%d: %s has no %s (not in its --help)' % (number, program, flag))

    for number, words in found:
        program = words[0]
        path = resolve(program)
        if path is None:
            continue
        programs.add(program)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            problems.append('README.md:%d: %s does not exist (or is not executable) at %s' % (number, program, path))
            continue
        name = os.path.basename(program)
        if name not in CHECKED:
            continue
        args = words[1:]
        if name == 'launch_local.sh':
            own, trainer_args = (args[:args.index('--')], args[args.index('--') + 1:]) if '--' in args else (args, [])
            # Values of options are not flags: --psd_flags "--nice -10" is one word.
            check_flags(number, program, path, own)
            trainer = 'build/examples/mnist_trainer'
            for i, w in enumerate(own):
                if w == '--trainer' and i + 1 < len(own):
                    trainer = own[i + 1]
                elif w.startswith('--trainer='):
                    trainer = w.split('=', 1)[1]
            if trainer_args:
                trainer_path = resolve(trainer)
                if trainer_path is None or not os.path.isfile(trainer_path):
                    problems.append('README.md:%d: trainer %s not found' % (number, trainer))
                else:
                    check_flags(number, trainer, trainer_path, trainer_args)
        else:
            check_flags(number, program, path, args)

    for p in problems:
        print(p)
    if not found or not programs:
        print('readme: found no scripts/ or build/ commands in README.md')
        return 1
    if problems:
        print('readme: %d problem(s)' % len(problems))
        return 1
    print('readme: %d commands (%s), %d flags, all present' % (len(found), ', '.join(sorted(programs)), checked_flags))
    return 0


if __name__ == '__main__':
    sys.exit(main())
