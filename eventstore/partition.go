package eventstore

import (
	"crypto/md5" //nolint:gosec // a stable spread of stream ids over partitions, not security
	"encoding/binary"
	"fmt"
)

// MaxPartitions is the largest Partition.Count a read accepts. A partitioned read in PostgreSQL
// uses an index per partition count (see eventstore/postgres Store.EnsurePartitions); counts
// beyond this many would split the log finer than any deployment can run workers for.
const MaxPartitions = 1024

// Partition selects the events of one partition of the log: the events of every stream whose
// PartitionOf(stream, Count) is Index. All the events of a stream fall in one partition, so a
// reader of a partition sees each of its streams whole and in version order.
//
// The zero value, and any Partition with Count 1, is the whole log (unpartitioned).
type Partition struct {
	// Index is the partition to read, from 0 to Count-1.
	Index int
	// Count is how many partitions the log is split into: 0 or 1 for none, at most
	// MaxPartitions.
	Count int
}

// Partitioned reports whether p selects part of the log (Count above 1).
func (p Partition) Partitioned() bool { return p.Count > 1 }

// Validate reports a Partition a store cannot read: Count below 0 or above MaxPartitions, or
// Index outside [0, Count) (only 0 when Count is 0). The error is a *ValidationError naming
// the field (Partition.Count or Partition.Index); it matches ErrInvalidInput.
func (p Partition) Validate() error {
	if p.Count < 0 || p.Count > MaxPartitions {
		return &ValidationError{Field: "Partition.Count", Index: -1,
			Reason: fmt.Sprintf("%d is out of range; use 1 to %d (0 or 1: the whole log, unpartitioned)", p.Count, MaxPartitions)}
	}
	if p.Index < 0 || p.Index >= max(p.Count, 1) {
		return &ValidationError{Field: "Partition.Index", Index: -1,
			Reason: fmt.Sprintf("%d is out of range for Count %d; use 0 to %d", p.Index, p.Count, max(p.Count, 1)-1)}
	}
	return nil
}

// Contains reports whether the events of streamID are in partition p; every stream is in the
// unpartitioned log.
func (p Partition) Contains(streamID string) bool {
	return PartitionOf(streamID, p.Count) == p.Index
}

// String formats p as "index/count", e.g. "3/16", or "all" when it is unpartitioned.
func (p Partition) String() string {
	if !p.Partitioned() {
		return "all"
	}
	return fmt.Sprintf("%d/%d", p.Index, p.Count)
}

// streamHash is the stable hash of a stream id that partitions are computed from (see
// PartitionOf); PostgreSQL computes it as ('x' || substr(md5(stream_id), 1, 8))::bit(32)::int
// (in a database with UTF8 encoding).
func streamHash(streamID string) int32 {
	sum := md5.Sum([]byte(streamID))               //nolint:gosec // see the import
	return int32(binary.BigEndian.Uint32(sum[:4])) //nolint:gosec // the two's-complement reading is the point
}

// PartitionOf returns the partition of streamID's events among count partitions:
// (hash & 0x7fffffff) % count, where hash is the first four bytes of the MD5 digest of the id's
// UTF-8 bytes read as a big-endian two's-complement int32. It is the same in every process and
// version, and the PostgreSQL store computes the same in SQL (eventstore/postgres
// PartitionSQL); 0 when count is 1 or less.
func PartitionOf(streamID string, count int) int {
	if count <= 1 {
		return 0
	}
	return int(PartitionKey(streamID) % uint32(count)) //nolint:gosec // count is at most MaxPartitions
}

// PartitionKey returns the key that places streamID's events in a partition, whatever the
// count: PartitionOf(streamID, count) is PartitionKey(streamID) % count. Triggers carry the
// keys of the streams they cover, so a partition's owner can tell whether one concerns it.
func PartitionKey(streamID string) uint32 {
	return uint32(streamHash(streamID) & 0x7fffffff) //nolint:gosec // masked to 31 bits
}

// ContainsKey reports whether the streams with partition key k (PartitionKey) are in p.
func (p Partition) ContainsKey(k uint32) bool {
	return !p.Partitioned() || int(k%uint32(p.Count)) == p.Index //nolint:gosec // Count is at most MaxPartitions
}

// Overlapping returns the indexes, in order, of the partitions of a split of the log into count
// that can hold streams of p: a stream is in partition k of count when its key is k modulo
// count, so it is in p and in k exactly when k and p.Index are equal modulo the greatest
// common divisor of the two counts. For a count that p.Count divides, that is one partition;
// for counts without a common divisor (and for the whole log on either side), every one.
// A count below 2 is the whole log: the result is [0].
func (p Partition) Overlapping(count int) []int {
	if count < 2 {
		return []int{0}
	}
	g := gcd(max(p.Count, 1), count)
	out := make([]int, 0, count/g)
	for k := p.Index % g; k < count; k += g {
		out = append(out, k)
	}
	return out
}

// gcd is the greatest common divisor of two positive numbers.
func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
