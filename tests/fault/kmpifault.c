/* A network fault for the cluster's tests (tests/cli/test_krun_cluster.sh),
 * LD_PRELOADed into every rank: MPI's profiling interface lets this library
 * define MPI_Isend and pass the call on to PMPI_Isend, so krun is not
 * changed to be tested.  KMPIFAULT_RANK=R and KMPIFAULT_AFTER=N: rank R's
 * message sends after its N-th fail as a broken connection would
 * (MPI_ERR_OTHER); the signs of life (MPI_Issend) are left alone, so what is
 * tested is a failed send, not a silent rank. */
#include <mpi.h>
#include <stdlib.h>

static long sent;

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, MPI_Request *req)
{
    const char *r = getenv("KMPIFAULT_RANK"), *n = getenv("KMPIFAULT_AFTER");
    int me = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (r && n && atoi(r) == me && ++sent > atol(n)) return MPI_ERR_OTHER;
    return PMPI_Isend(buf, count, type, dest, tag, comm, req);
}
