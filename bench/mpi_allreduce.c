/* Open MPI MPI_Allreduce with the sizes, iterations and RESULT lines of allreduce_bench.c. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int rank, n;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t maxb = (size_t)64 << 20;
    float *buf = malloc(maxb);
    double t[64];
    const char *impl = argc > 1 ? argv[1] : "mpi";
    for (size_t bytes = 4096; bytes <= maxb; bytes *= 4) {
        int count = (int)(bytes / 4), it = bytes >= (16u << 20)  ? 10
                                           : bytes >= (1u << 20) ? 20
                                                                 : 50;
        for (int i = 0; i < count; i++)
            buf[i] = 1.0f;
        for (int w = 0; w < 3; w++)
            MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < it; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            t[i] = (MPI_Wtime() - t0) * 1e6;
        }
        for (int i = 0; i < count; i++)
            buf[i] = 1.0f;
        MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        int wrong = 0;
        for (int i = 0; i < count && !wrong; i++)
            wrong = buf[i] != (float)n;
        MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        qsort(t, (size_t)it, sizeof(double), cmp_d);
        double med = t[it / 2];
        MPI_Allreduce(MPI_IN_PLACE, &med, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double algbw = (double)bytes / med / 1e3;
        if (rank == 0)
            printf("RESULT %s %d %zu %.1f %.3f %.3f %d\n", impl, n, bytes, med, algbw,
                   algbw * 2.0 * (n - 1) / n, wrong);
        fflush(stdout);
    }
    MPI_Finalize();
    return 0;
}
