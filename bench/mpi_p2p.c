/* Open MPI's ping-pong (MPI_Send/MPI_Recv) with bench/p2p_bench.c's sizes, counts and RESULT
 * lines. Build: mpicc -O2 -o mpi_p2p bench/mpi_p2p.c */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    const char *impl = argc > 1 ? argv[1] : "mpi";
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int peer = 1 - rank;
    size_t maxb = (size_t)64 << 20;
    unsigned char *a = malloc(maxb), *b = malloc(maxb);
    static double t[1000];
    for (size_t bytes = 8; bytes <= maxb; bytes *= 8) {
        int it = bytes >= (16u << 20) ? 10 : bytes >= (1u << 20) ? 30 : 200, wrong = 0;
        for (int i = -3; i < it; i++) {
            if (rank == 0) {
                memset(a, (unsigned char)(i + 7), bytes);
                double t0 = MPI_Wtime();
                MPI_Send(a, (int)bytes, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                MPI_Recv(b, (int)bytes, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (i >= 0)
                    t[i] = (MPI_Wtime() - t0) * 1e6 / 2;
                wrong += b[0] != (unsigned char)(i + 7) || b[bytes - 1] != (unsigned char)(i + 7);
            } else if (rank == 1) {
                MPI_Recv(b, (int)bytes, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(b, (int)bytes, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
            }
        }
        if (rank == 0) {
            qsort(t, (size_t)it, sizeof(double), cmp_d);
            double us = t[it / 2];
            printf("RESULT %s %zu %.2f %.3f %d\n", impl, bytes, us, (double)bytes / us / 1e3,
                   wrong);
            fflush(stdout);
        }
    }
    MPI_Finalize();
    return 0;
}
