package statements

// Ordered is the statements of ordered subscribers' chains (ordered.sql).
// The chain logic itself lives in SQL functions (migrations 008 and 012); these call
// them, and append what a round's stamp adds.
type Ordered struct {
	ChainPrepare, ChainAppend, ChainDefer string
	ChainAppendLate                       string
	ChainAdvance, ChainSweep              string
	ChainComplete, ChainHandBack          string
	ChainOutOfTurn                        string
	ChainRelease, ChainLockEmpty          string
	ChainDropEmpty                        string
	ChainRetired, ChainRepair             string
	ChainRescue                           string
	ChainResume, ChainSkip                string
	ListChains, JobState, JobFence        string
}
