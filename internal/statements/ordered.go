package statements

// Ordered is the statements of ordered subscribers' chains (ordered.sql).
// The chain logic itself lives in SQL functions (migration 008); these call
// them, and append what a round's stamp adds.
type Ordered struct {
	ChainPrepare, ChainAppend, ChainDefer string
	ChainAdvance, ChainSweep              string
	ChainRelease, ChainDropEmpty          string
	ChainRescue                           string
	ChainResume, ChainSkip                string
	ListChains, JobState, JobFence        string
}
