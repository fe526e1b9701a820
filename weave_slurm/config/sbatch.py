"""sbatch's own options in a weave job: what ``#SBATCH`` and ``#WEAVE`` lines (and
weave-sbatch's flags) may say about the Slurm side of a job, and the spec's ``[slurm]``.

Honoured (:data:`SBATCH_OPTIONS`): ``--account``/``-A``, ``--qos``/``-q``,
``--time``/``-t`` (sbatch's formats: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``,
``D-H:M:S``; seconds round up to the next minute, ``0``/``UNLIMITED`` = none, as
Slurm), ``--output``/``-o``, ``--error``/``-e``, ``--job-name``/``-J`` and
``--chdir``/``-D`` (the workers' working directory), ``--dependency``/``-d``,
``--hold``/``-H``, ``--array``/``-a`` (``config/job_array.py``) and ``--container`` (an OCI
bundle the job's processes run in: config/oci.py). Each is written ``--opt value``,
``--opt=value``, ``-X value`` or ``-Xvalue``. Any other sbatch option is refused in one
line listing these: weave chooses the partitions, nodes and GPUs of a group itself.

The spec's ``[slurm]`` table (:class:`JobSlurm`) holds ``account``, ``qos``,
``time_limit_min``, ``output``, ``error``, ``dependency``, ``hold`` and ``container``;
:func:`log_path` expands an output pattern as sbatch does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from weave_slurm.config.dependency import dependency_text
from weave_slurm.config.job_array import array_text, parse_array
from weave_slurm.config.reader import TableReader
from weave_slurm.config.site import MAX_TIME_LIMIT_MIN, SlurmConfig
from weave_slurm.errors import ConfigError, InfeasibleRequest

#: A Slurm account or QOS name (as the site's ``[slurm]`` table takes them).
SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")
TIME_FORMATS = "M, M:S, H:M:S, D-H, D-H:M or D-H:M:S (e.g. 90, 1:30:00, 2-12)"
#: Longest ``--output``/``--error`` pattern accepted.
MAX_LOG_PATTERN = 1024


@dataclass(frozen=True, slots=True)
class SbatchOption:
    long: str            # sbatch's long name (without the dashes)
    short: str | None    # its one-letter form
    flag: str            # the weave directive it sets (daemon/submission.py)


#: The sbatch options weave honours, in the order a refusal lists them.
SBATCH_OPTIONS: tuple[SbatchOption, ...] = (
    SbatchOption("account", "A", "account"),
    SbatchOption("qos", "q", "qos"),
    SbatchOption("time", "t", "time"),
    SbatchOption("output", "o", "output"),
    SbatchOption("error", "e", "error"),
    SbatchOption("job-name", "J", "job-name"),
    SbatchOption("chdir", "D", "workdir"),
    SbatchOption("dependency", "d", "dependency"),
    SbatchOption("hold", "H", "hold"),
    SbatchOption("array", "a", "array"),
    SbatchOption("container", None, "container"),
)
#: Honoured options that take no value.
SBATCH_SWITCHES = frozenset({"hold"})
_BY_LONG = {o.long: o for o in SBATCH_OPTIONS}
_BY_SHORT = {o.short: o for o in SBATCH_OPTIONS if o.short}
HONOURED = ", ".join(f"--{o.long}/-{o.short}" if o.short else f"--{o.long}"
                     for o in SBATCH_OPTIONS)


@dataclass(frozen=True, slots=True)
class JobSlurm:
    """A job's own Slurm terms (``[slurm]`` in its spec; None: the site's ``[slurm]``)."""

    account: str | None = None
    qos: str | None = None
    time_limit_min: int | None = None   # the job ends once it has run this long
    output: str | None = None           # stdout pattern (LOG_CODES), as sbatch's
    error: str | None = None            # stderr pattern; None: with stdout
    dependency: str | None = None       # --dependency (config/dependency.py)
    hold: bool = False                  # --hold: PENDING until `weave release`
    array: str | None = None            # --array (config/job_array.py)
    array_job: int | None = None        # an element's array job id (set by weaved)
    array_task: int | None = None       # an element's task id (set by weaved)
    container: str | None = None        # --container: an OCI bundle (config/oci.py)

    def array_env(self) -> dict[str, str]:
        """The ``SLURM_ARRAY_*`` variables of an array's element (none: a job not in an
        array)."""
        if self.array is None or self.array_job is None or self.array_task is None:
            return {}
        return parse_array(self.array).env(self.array_job, self.array_task)


#: A job with no ``[slurm]`` table: the site's terms, no limit of its own.
NO_SLURM = JobSlurm()


def expand_short(word: str) -> tuple[str, str | None] | None:
    """``-A``/``-Aphys`` -> ``("account", None | "phys")``; None if not a short option."""
    if len(word) < 2 or word[0] != "-" or word[1] == "-":
        return None
    opt = _BY_SHORT.get(word[1])
    if opt is None:
        return None
    return opt.flag, (word[2:] or None)


@dataclass(frozen=True, slots=True)
class Unhonoured:
    """An sbatch option weave does not take, where it was, and what to do instead."""

    where: str      # "script.sh:3"
    word: str       # the option as written, without its value ("--gres", "-N")

    @property
    def advice(self) -> str:
        name = self.word.lstrip("-")
        name = _SHORT_NAMES.get(name, name) if not self.word.startswith("--") else name
        return _ADVICE.get(name, "weave has no equivalent; remove the line")


#: What to do instead of each sbatch option weave cannot honour (by long name).
_PLACEMENT = ("weave picks the partitions, nodes and GPUs of a group: give the job's GPUs "
              "with #WEAVE --rollout-gpus/--train-gpus (--engine-gpus per engine)")
_ADVICE: dict[str, str] = {
    **dict.fromkeys(("nodes", "ntasks", "ntasks-per-node", "cpus-per-task", "gres", "gpus",
                     "gpus-per-node", "gpus-per-task", "cpus-per-gpu", "nodelist", "exclude",
                     "constraint", "sockets-per-node", "cores-per-socket",
                     "threads-per-core", "distribution", "gpu-bind"), _PLACEMENT),
    "partition": "weave runs rollout on the site's rollout partition and training on its "
                 "training partition (weave groups shows them)",
    "exclusive": "use --solo to run the job alone in its group",
    **dict.fromkeys(("mem", "mem-per-cpu", "mem-per-gpu"),
                    "host memory follows the job's warm state: give #WEAVE "
                    "--rollout-state-gib/--train-state-gib"),
    **dict.fromkeys(("mail-type", "mail-user"),
                    "weave sends no mail: follow the job with weave status -i or weave logs"),
    "export": "a hosted job runs in its workers' environment; a cooperative job gets "
              "yours ([launch.env] in a spec)",
    "wrap": "give --wrap on weave-sbatch's command line",
    **dict.fromkeys(("requeue", "no-requeue"),
                    "weaved requeues a job whose group cannot start (the site's "
                    "max_requeues)"),
}
#: sbatch's one-letter options weave refuses, by long name (for their advice).
_SHORT_NAMES = {"N": "nodes", "n": "ntasks", "c": "cpus-per-task", "G": "gpus",
                "w": "nodelist", "x": "exclude", "C": "constraint", "p": "partition",
                "m": "distribution"}
#: sbatch options that take no value (so the word after one is not its value).
_SWITCH = frozenset(("exclusive", "requeue", "no-requeue", "hold", "H", "overcommit", "O",
                     "contiguous", "use-min-nodes", "spread-job", "quiet", "Q", "verbose",
                     "v", "no-kill", "k", "get-user-env", "ignore-pbs", "parsable",
                     "test-only", "wait", "W"))


def sbatch_scan(words: Sequence[str], where: str
                ) -> tuple[list[tuple[str, str]], list[Unhonoured]]:
    """``(weave flag, value)`` for each honoured option of an ``#SBATCH`` line, and the
    options weave cannot honour (their values skipped), to be refused all at once."""
    out: list[tuple[str, str]] = []
    refused: list[Unhonoured] = []
    i = 0
    while i < len(words):
        word = words[i]
        short = expand_short(word)
        if short is None and not word.startswith("--"):
            refused.append(Unhonoured(where, word[:2] if word.startswith("-") else word[:40]))
            i += 1 + _takes_value(word, words, i, short_form=True)
            continue
        if short is not None:
            flag, value = short
            shown = word[:2]
            if flag in SBATCH_SWITCHES and value is None:
                out.append((flag, "yes"))
                i += 1
                continue
        else:
            name, eq, raw = word[2:].partition("=")
            opt = _BY_LONG.get(name)
            if opt is None:
                refused.append(Unhonoured(where, f"--{name}"[:40]))
                i += 1 + (0 if eq else _takes_value(name, words, i))
                continue
            flag, value, shown = opt.flag, (raw if eq else None), f"--{name}"
            if flag in SBATCH_SWITCHES and value is None:
                out.append((flag, "yes"))
                i += 1
                continue
        if value is None:
            if i + 1 >= len(words):
                raise ConfigError(f"{where}: #SBATCH {shown} needs a value")
            value, i = words[i + 1], i + 1
        out.append((flag, value))
        i += 1
    return out, refused


def _takes_value(name: str, words: Sequence[str], i: int, short_form: bool = False) -> int:
    """1 when the word after option ``name`` at ``i`` is its value, else 0."""
    if short_form:
        if not name.startswith("-") or len(name) != 2:
            return 0                 # '-N2' (value attached) or a stray word
        name = name[1]
    nxt = words[i + 1] if i + 1 < len(words) else None
    return 0 if name in _SWITCH or nxt is None or nxt.startswith("-") else 1


def sbatch_tokens(words: Sequence[str], where: str) -> list[tuple[str, str]]:
    """``(weave flag, value)`` for each option of an ``#SBATCH`` line; anything else is
    refused in one line naming it and listing what is honoured."""
    out, refused = sbatch_scan(words, where)
    if refused:
        raise refusal(refused)
    return out


def refusal(refused: Sequence[Unhonoured]) -> ConfigError:
    """One line naming every option weave cannot honour, each with what to do instead."""
    if len(refused) == 1:
        r = refused[0]
        return ConfigError(f"{r.where}: #SBATCH {r.word!r} is not honoured by weave "
                           f"({r.advice}); honoured: {HONOURED}")
    source = refused[0].where.rpartition(":")[0] or refused[0].where
    items = "; ".join(f"{r.where} {r.word!r} ({r.advice})" for r in refused)
    return ConfigError(f"{source}: {len(refused)} #SBATCH options are not honoured by "
                       f"weave: {items}; honoured: {HONOURED}")


def parse_time_min(raw: str) -> int | None:
    """sbatch's ``--time`` in minutes (seconds round up); None for no limit (0, UNLIMITED)."""
    text = raw.strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, dash, rest = text.partition("-")
    if not dash:
        days, rest = "", text
    parts = rest.split(":")
    if not all(p.isdigit() and len(p) <= 9 for p in parts) or (dash and not days.isdigit()) \
            or len(parts) > 3:
        raise ConfigError(f"not one of {TIME_FORMATS}")
    d = int(days) if dash else 0
    nums = [int(p) for p in parts]
    if dash:   # D-H, D-H:M, D-H:M:S
        h, m, s = [*nums, 0, 0][:3]
    elif len(nums) == 3:   # H:M:S
        h, m, s = nums
    else:   # M, M:S
        h, m, s = 0, nums[0], (nums[1] if len(nums) == 2 else 0)
    minutes = (d * 24 + h) * 60 + m + (1 if s > 0 else 0)
    if minutes == 0:
        return None
    if minutes > MAX_TIME_LIMIT_MIN:
        raise ConfigError(f"{minutes} minutes; at most {MAX_TIME_LIMIT_MIN} (365 days)")
    return minutes


def _name_problem(raw: str) -> str | None:
    if SLURM_NAME_RE.match(raw):
        return None
    return "must be a Slurm name of 1-64 letters, digits, '_', '.' or '-'"


_CODE = re.compile(r"%([0-9]*)(.?)", re.DOTALL)


#: The replacements of an ``--output``/``--error`` pattern, as sbatch's.
LOG_CODES = ("%j (job id), %x (job name), %u (user), %N (short host name of the node that "
             "writes it), %A (array job id), %a (array task id), %% (a '%')")
#: ``%a`` of a job not in an array, as Slurm writes it (its NO_VAL).
NO_TASK = "4294967294"


def _pattern_problem(raw: str) -> str | None:
    if not raw.strip() or not raw.isprintable() or len(raw) > MAX_LOG_PATTERN:
        return (f"must be a printable file name pattern of 1-{MAX_LOG_PATTERN} characters "
                f"({LOG_CODES})")
    for m in _CODE.finditer(raw):
        if m.group(2) not in ("j", "u", "x", "N", "a", "A", "%"):
            return f"unknown replacement '%{m.group(1)}{m.group(2)}'; valid: {LOG_CODES}"
    return None


def slurm_name(raw: str) -> str:
    """An account or QOS name, checked."""
    why = _name_problem(raw)
    if why:
        raise ConfigError(why)
    return raw


def log_pattern(raw: str) -> str:
    """An ``--output``/``--error`` pattern, checked (expanded by :func:`log_path`)."""
    why = _pattern_problem(raw)
    if why:
        raise ConfigError(why)
    return raw


def log_path(pattern: str, *, job_id: int | str, user: str, job_name: str,
             workdir: str | None = None, array_job: int | None = None,
             array_task: int | None = None) -> str:
    """Where a job's output goes: ``pattern`` with ``%j`` (the weave job id), ``%u``
    (user), ``%x`` (job name), ``%A``/``%a`` (array job and task id; a job not in an
    array: its own id and :data:`NO_TASK`, as Slurm) and ``%%`` expanded as sbatch does
    (``%5j``: zero-padded to 5), relative to ``workdir`` when not absolute. ``%N`` and
    ``%%`` are left to the host that opens the file (:func:`host_path`, once). The one
    resolution every job kind uses (hosted jobs' event log and workers, cooperative
    jobs' stdout/stderr)."""
    numbers = {"j": str(job_id), "A": str(job_id if array_job is None else array_job),
               "a": NO_TASK if array_task is None else str(array_task)}

    def one(m: re.Match[str]) -> str:
        width, code = m.group(1), m.group(2)
        if code in ("%", "N"):   # host_path's, where the file is opened
            return m.group(0)
        if code in numbers:
            return numbers[code].zfill(int(width)) if width else numbers[code]
        return {"u": user, "x": job_name}.get(code, m.group(0))
    path = _CODE.sub(one, pattern)
    if workdir and not path.startswith("/"):
        path = f"{workdir.rstrip('/')}/{path}"
    return path


def host_path(path: str, host: str) -> str:
    """``path`` from :func:`log_path` with ``%N`` (``host``'s short name) and ``%%``
    expanded: where the file is opened, once (``host="%N"``: the name shown, as
    ``weave show job`` shows it before a node writes it)."""
    if "%" not in path:
        return path
    short = host.split(".")[0]
    return _CODE.sub(lambda m: short if m.group(2) == "N" else
                     "%" if m.group(2) == "%" else m.group(0), path)


def read_job_slurm(r: TableReader | None) -> JobSlurm:
    """``[slurm]`` of a job spec: account, qos, time_limit_min, output, error,
    dependency, hold, array, container."""
    if r is None:
        return JobSlurm()
    values: dict[str, str | None] = {}
    for key, check in (("account", _name_problem), ("qos", _name_problem),
                       ("output", _pattern_problem), ("error", _pattern_problem)):
        value = r.opt_string(key)
        why = None if value is None else check(value)
        if why:
            raise r.fail(key, value, why)
        values[key] = value
    limit = r.opt_integer("time_limit_min")
    if limit is not None and not 1 <= limit <= MAX_TIME_LIMIT_MIN:
        raise r.fail("time_limit_min", limit, f"must be minutes between 1 and "
                     f"{MAX_TIME_LIMIT_MIN}; leave it out for no limit of its own")
    dependency = _checked(r, "dependency", dependency_text)
    hold = r.boolean("hold", False)
    array = _checked(r, "array", array_text)
    container = r.opt_string("container")
    if container is not None and not container.startswith("/"):
        raise r.fail("container", container, "must be an absolute path to an OCI bundle "
                     "(a directory with config.json and rootfs/)")
    r.done()
    return JobSlurm(account=values["account"], qos=values["qos"], time_limit_min=limit,
                    output=values["output"], error=values["error"], dependency=dependency,
                    hold=hold, array=array, container=container)


def _checked(r: TableReader, key: str, check: Callable[[str], str]) -> str | None:
    """String ``key`` of ``[slurm]`` as ``check`` writes it (None: not given); its
    refusal names the key."""
    value = r.opt_string(key)
    if value is None:
        return None
    try:
        return check(value)
    except ConfigError as exc:
        raise r.fail(key, value, str(exc)) from None


def refuse_over_site(job: JobSlurm, site: SlurmConfig, where: str) -> None:
    """InfeasibleRequest when the job asks for more time than the site's allocations are
    given (``[slurm] time_limit_min``): weave could not keep it running that long."""
    limit, most = job.time_limit_min, site.time_limit_min
    if limit is not None and most is not None and limit > most:
        raise InfeasibleRequest(f"{where}: --time of {limit} min exceeds this site's limit of "
                                f"{most} min ([slurm] time_limit_min); ask for at most {most}")
