/* The table of provisioners (cli/provision/provision.h): which one reaches a node. */
#include "cli/provision/provision.h"
#include "cli/spec/job.h"

#include "common/banned.h"

const struct ddp__prov_ops *ddp__provisioner(const struct ddp_job *job, size_t i)
{
    if (job->external)
        return &ddp__prov_external;
    if (ddp__job_host_is_local(job->nodes[i].host))
        return &ddp__prov_local;
    return job->srun ? &ddp__prov_srun : &ddp__prov_ssh;
}
