"""Site config and job specs: typed, frozen, strict TOML loading."""

from weave_slurm.config.job import Algorithm, JobSpec, load_job, parse_job
from weave_slurm.config.site import SiteConfig, default_site, load_site, parse_site
from weave_slurm.vocab import Pool

__all__ = ["Algorithm", "JobSpec", "Pool", "SiteConfig", "default_site", "load_job",
           "load_site", "parse_job", "parse_site"]
