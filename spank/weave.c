/*
 * weave.so: the weave-slurm SPANK plugin.
 *
 * Adds to sbatch, salloc and srun:
 *   --weave-slo=<float>   permitted slowdown of the job, >= 1.0     -> WEAVE_SLO
 *   --weave-group=<id>    co-execution group id ([A-Za-z0-9_.-])    -> WEAVE_GROUP
 *   --weave-spec=<path>   the job spec (TOML) of the RL job         -> WEAVE_SPEC
 * and gives every task of a step WEAVE_NODE_SOCKET=<sockdir>/node-<SLURMD_NODENAME>.sock,
 * the unix socket of the weave node daemon of the task's node; where the step's
 * allocation holds a GPU share of the node, <sockdir>/node-<node>.<SLURM_JOB_ID>.sock,
 * its own share's daemon, if that socket exists.
 *
 * plugstack.conf:  optional /path/weave.so [sockdir=/run/weave]
 *
 * Layout (after NVIDIA pyxis, but small): an option table whose callbacks only
 * validate and store, and one dispatcher per SPANK hook that acts by context.
 * Options are registered with spank_option_register() in slurm_spank_init so
 * that they show in `sbatch --help` and `salloc --help`, not only in srun.
 * Every message starts with "weave:" and quotes the offending value.
 */

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(weave, 1);

#define WEAVE_DEFAULT_SOCKDIR "/run/weave"
#define WEAVE_MAX_VALUE 4096

static struct {
	char sockdir[WEAVE_MAX_VALUE];
	char slo[64];
	char group[65];
	char spec[WEAVE_MAX_VALUE];
} weave = { WEAVE_DEFAULT_SOCKDIR, "", "", "" };

static int opt_slo(int val, const char *optarg, int remote);
static int opt_group(int val, const char *optarg, int remote);
static int opt_spec(int val, const char *optarg, int remote);

static struct spank_option weave_options[] = {
	{ "weave-slo", "SLO",
	  "weave: permitted slowdown of this RL job (float >= 1.0, e.g. 1.5)",
	  1, 0, (spank_opt_cb_f)opt_slo },
	{ "weave-group", "ID",
	  "weave: co-execution group id (letters, digits, '_', '.', '-')",
	  1, 0, (spank_opt_cb_f)opt_group },
	{ "weave-spec", "PATH",
	  "weave: path of the RL job spec (TOML)",
	  1, 0, (spank_opt_cb_f)opt_spec },
	SPANK_OPTIONS_TABLE_END
};

/* -- option callbacks: validate and store ------------------------------------------ */

static int opt_slo(int val, const char *optarg, int remote)
{
	char *end = NULL;
	double slo;

	(void)val;
	(void)remote;
	if (optarg == NULL || *optarg == '\0') {
		slurm_error("weave: --weave-slo needs a value: a float >= 1.0, e.g. 1.5");
		return ESPANK_BAD_ARG;
	}
	errno = 0;
	slo = strtod(optarg, &end);
	if (errno != 0 || end == optarg || *end != '\0' || !isfinite(slo)) {
		slurm_error("weave: --weave-slo='%s' is not a number; give a float >= 1.0, e.g. 1.5",
			    optarg);
		return ESPANK_BAD_ARG;
	}
	if (slo < 1.0) {
		slurm_error("weave: --weave-slo='%s' is below 1.0; the SLO is a permitted slowdown"
			    " (1.0 = none), e.g. 1.5", optarg);
		return ESPANK_BAD_ARG;
	}
	snprintf(weave.slo, sizeof(weave.slo), "%s", optarg);
	return ESPANK_SUCCESS;
}

static int opt_group(int val, const char *optarg, int remote)
{
	size_t n;

	(void)val;
	(void)remote;
	n = optarg ? strlen(optarg) : 0;
	if (n == 0 || n >= sizeof(weave.group)
	    || strspn(optarg, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
			      "0123456789_.-") != n) {
		slurm_error("weave: --weave-group='%s' is not a group id; use 1-64 of letters,"
			    " digits, '_', '.', '-'", optarg ? optarg : "");
		return ESPANK_BAD_ARG;
	}
	snprintf(weave.group, sizeof(weave.group), "%s", optarg);
	return ESPANK_SUCCESS;
}

static int opt_spec(int val, const char *optarg, int remote)
{
	(void)val;
	if (optarg == NULL || *optarg == '\0' || strlen(optarg) >= sizeof(weave.spec)) {
		slurm_error("weave: --weave-spec='%s' is not a usable path; give the job spec"
			    " TOML file", optarg ? optarg : "");
		return ESPANK_BAD_ARG;
	}
	/* Only the submitting side can check the file; nodes may not see it. */
	if (!remote && access(optarg, R_OK) != 0) {
		slurm_error("weave: --weave-spec='%s' cannot be read: %s", optarg,
			    strerror(errno));
		return ESPANK_BAD_ARG;
	}
	snprintf(weave.spec, sizeof(weave.spec), "%s", optarg);
	return ESPANK_SUCCESS;
}

/* -- plugstack.conf arguments ------------------------------------------------------ */

static int parse_args(int ac, char **av)
{
	for (int i = 0; i < ac; i++) {
		if (strncmp(av[i], "sockdir=", 8) == 0 && av[i][8] == '/'
		    && strlen(av[i] + 8) < sizeof(weave.sockdir) - 64) {
			snprintf(weave.sockdir, sizeof(weave.sockdir), "%s", av[i] + 8);
			continue;
		}
		slurm_error("weave: plugstack.conf argument '%s' is not valid; valid:"
			    " sockdir=<absolute dir>", av[i]);
		return ESPANK_BAD_ARG;
	}
	return ESPANK_SUCCESS;
}

/* -- hooks: one dispatcher each ---------------------------------------------------- */

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	int rc;

	if (ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR && ctx != S_CTX_REMOTE)
		return ESPANK_SUCCESS;
	rc = parse_args(ac, av);
	if (rc != ESPANK_SUCCESS)
		return rc;
	for (struct spank_option *o = weave_options; o->name != NULL; o++) {
		rc = spank_option_register(sp, o);
		if (rc != ESPANK_SUCCESS) {
			slurm_error("weave: cannot register --%s: %s", o->name, spank_strerror(rc));
			return rc;
		}
	}
	return ESPANK_SUCCESS;
}

/* Submitting side (sbatch/salloc/srun): the job inherits the client's environment. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();

	(void)sp;
	(void)ac;
	(void)av;
	if (ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR)
		return ESPANK_SUCCESS;
	if (weave.slo[0] && setenv("WEAVE_SLO", weave.slo, 1) != 0)
		return ESPANK_ERROR;
	if (weave.group[0] && setenv("WEAVE_GROUP", weave.group, 1) != 0)
		return ESPANK_ERROR;
	if (weave.spec[0] && setenv("WEAVE_SPEC", weave.spec, 1) != 0)
		return ESPANK_ERROR;
	return ESPANK_SUCCESS;
}

static int set_job_env(spank_t sp, const char *name, const char *value)
{
	spank_err_t rc;

	if (value[0] == '\0')
		return ESPANK_SUCCESS;
	rc = spank_setenv(sp, name, value, 1);
	if (rc != ESPANK_SUCCESS)
		slurm_error("weave: cannot set %s='%s' in the step: %s", name, value,
			    spank_strerror(rc));
	return rc;
}

/* Node side (slurmstepd): the options were forwarded, export them into the step. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (!spank_remote(sp))
		return ESPANK_SUCCESS;
	if (set_job_env(sp, "WEAVE_SLO", weave.slo) != ESPANK_SUCCESS
	    || set_job_env(sp, "WEAVE_GROUP", weave.group) != ESPANK_SUCCESS
	    || set_job_env(sp, "WEAVE_SPEC", weave.spec) != ESPANK_SUCCESS)
		return ESPANK_ERROR;
	return ESPANK_SUCCESS;
}

/* Each task: point it at the node daemon of its node. */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	char node[256];
	char job[64];
	char path[WEAVE_MAX_VALUE];

	(void)ac;
	(void)av;
	if (!spank_remote(sp))
		return ESPANK_SUCCESS;
	if (spank_getenv(sp, "SLURMD_NODENAME", node, sizeof(node)) != ESPANK_SUCCESS
	    || node[0] == '\0') {
		slurm_error("weave: SLURMD_NODENAME is not set in the task; WEAVE_NODE_SOCKET"
			    " left unset");
		return ESPANK_SUCCESS;
	}
	/* the daemon of this allocation's GPU share, where there is one (a node shared by
	 * several groups' allocations keys each daemon's socket by its job id) */
	if (spank_getenv(sp, "SLURM_JOB_ID", job, sizeof(job)) == ESPANK_SUCCESS
	    && job[0] != '\0'
	    && snprintf(path, sizeof(path), "%s/node-%s.%s.sock", weave.sockdir, node, job)
	       < (int)sizeof(path)
	    && access(path, F_OK) == 0)
		return set_job_env(sp, "WEAVE_NODE_SOCKET", path);
	if (snprintf(path, sizeof(path), "%s/node-%s.sock", weave.sockdir, node)
	    >= (int)sizeof(path))
		return ESPANK_ERROR;
	return set_job_env(sp, "WEAVE_NODE_SOCKET", path);
}
